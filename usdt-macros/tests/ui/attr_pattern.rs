#[selftrace::usdt::probe]
fn f((a, b): (u32, u32)) -> u32 {
    a + b
}
fn main() {
    f((1, 2));
}
