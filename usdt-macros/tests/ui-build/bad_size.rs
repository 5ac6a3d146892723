struct Three;
impl selftrace::usdt::ProbeArg for Three {
    const SIZE: i32 = 3;
    fn probe_value(&self) -> u64 {
        0
    }
}
fn main() {
    selftrace::probe!(p, n, Three);
}
