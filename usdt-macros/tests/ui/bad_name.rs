fn main() {
    selftrace::probe!(p, "has-dash", 1u8);
    selftrace::probe!(p, 9lives);
}
