#[selftrace::usdt::probe]
struct S;
fn main() {}
