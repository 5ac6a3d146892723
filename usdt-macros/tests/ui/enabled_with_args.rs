fn main() {
    let _ = selftrace::probe_enabled!(p, n, 1);
}
