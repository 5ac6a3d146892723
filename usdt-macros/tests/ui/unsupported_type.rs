fn main() {
    let v = vec![1u32];
    selftrace::probe!(p, n, v);
}
