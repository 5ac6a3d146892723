#[selftrace::usdt::probe]
fn f(v: Vec<u32>) -> usize {
    v.len()
}
fn main() {
    f(vec![]);
}
