fn main() {
    let s = "x";
    // &str is two probe arguments: 7 of them make 14.
    selftrace::probe!(p, n, s, s, s, s, s, s, s);
}
