#[selftrace::usdt::probe]
const fn f(x: u32) -> u32 {
    x
}
fn main() {
    f(1);
}
