#[selftrace::usdt::probe(prvider = "x")]
fn f(x: u32) -> u32 {
    x
}
#[selftrace::usdt::probe(name = "bad name")]
fn g() {}
fn main() {
    f(1);
    g();
}
