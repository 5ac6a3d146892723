//! [`ProbeArg`]: how a Rust value becomes a USDT probe argument.

/// A value that can be passed to a probe.
///
/// A probe argument is one machine word in a register; the note tells the tracer how many of
/// its low bytes to read and whether they are signed (`SIZE`). Implemented for every integer
/// type, `bool` (1 byte, 0 or 1), `char` (4 bytes, the code point), `f32`/`f64` (their bits:
/// tracers see an unsigned integer, reinterpret it), raw pointers and references (the address;
/// `&T` for a sized `T`), and for `&str`, `&[u8]`, `String`, `Vec<u8>`: these are **two**
/// probe arguments, the pointer then the length in bytes (so `probe!(p, n, s)` with `s: &str` is
/// read in bpftrace as `str(arg0, arg1)`), and count twice towards the limit of 12.
///
/// `&String` is a reference to a sized value, so it passes the `String`'s address; pass the
/// `String` itself or `s.as_str()` for its text.
///
/// Implement it for your own types by choosing a scalar representation:
///
/// ```
/// struct UserId(u32);
/// impl selftrace::usdt::ProbeArg for UserId {
///     const SIZE: i32 = 4; // unsigned, 4 bytes
///     fn probe_value(&self) -> u64 {
///         self.0 as u64
///     }
/// }
/// let id = UserId(7);
/// selftrace::probe!(myapp, login, id);
/// ```
pub trait ProbeArg {
    /// The argument's size in bytes, negative when signed: one of 1, 2, 4, 8, -1, -2, -4, -8.
    /// Anything else is a compile error at the probe.
    const SIZE: i32;

    /// The value, in the low `|SIZE|` bytes of the word (sign-extended or not, the tracer reads
    /// only those bytes).
    fn probe_value(&self) -> u64;

    /// How many words this argument takes: 1, or 2 for a pointer and a length.
    #[doc(hidden)]
    const __WORDS: usize = 1;

    /// The argument's words: `[value, 0]`, or `[pointer, length]` when `__WORDS == 2`.
    #[doc(hidden)]
    #[inline(always)]
    fn __probe_words(&self) -> [u64; 2] {
        [self.probe_value(), 0]
    }
}

macro_rules! int_arg {
    ($($t:ty => $size:expr),* $(,)?) => {$(
        impl ProbeArg for $t {
            const SIZE: i32 = $size;
            #[inline(always)]
            fn probe_value(&self) -> u64 {
                // Sign-extends signed types; the tracer reads |SIZE| bytes anyway.
                *self as i128 as u64
            }
        }
    )*};
}

int_arg! {
    i8 => -1, i16 => -2, i32 => -4, i64 => -8, isize => -8,
    u8 => 1, u16 => 2, u32 => 4, u64 => 8, usize => 8,
}

impl ProbeArg for i128 {
    /// Only the low 64 bits are passed.
    const SIZE: i32 = -8;
    #[inline(always)]
    fn probe_value(&self) -> u64 {
        *self as u64
    }
}

impl ProbeArg for u128 {
    /// Only the low 64 bits are passed.
    const SIZE: i32 = 8;
    #[inline(always)]
    fn probe_value(&self) -> u64 {
        *self as u64
    }
}

impl ProbeArg for bool {
    const SIZE: i32 = 1;
    #[inline(always)]
    fn probe_value(&self) -> u64 {
        *self as u64
    }
}

impl ProbeArg for char {
    const SIZE: i32 = 4;
    #[inline(always)]
    fn probe_value(&self) -> u64 {
        *self as u64
    }
}

impl ProbeArg for f32 {
    /// The IEEE-754 bits.
    const SIZE: i32 = 4;
    #[inline(always)]
    fn probe_value(&self) -> u64 {
        self.to_bits() as u64
    }
}

impl ProbeArg for f64 {
    /// The IEEE-754 bits.
    const SIZE: i32 = 8;
    #[inline(always)]
    fn probe_value(&self) -> u64 {
        self.to_bits()
    }
}

impl<T: ?Sized> ProbeArg for *const T {
    /// The address (the data pointer of a fat pointer).
    const SIZE: i32 = 8;
    #[inline(always)]
    fn probe_value(&self) -> u64 {
        self.cast::<u8>() as usize as u64
    }
}

impl<T: ?Sized> ProbeArg for *mut T {
    /// The address (the data pointer of a fat pointer).
    const SIZE: i32 = 8;
    #[inline(always)]
    fn probe_value(&self) -> u64 {
        self.cast::<u8>() as usize as u64
    }
}

impl<T> ProbeArg for &T {
    /// The address.
    const SIZE: i32 = 8;
    #[inline(always)]
    fn probe_value(&self) -> u64 {
        *self as *const T as usize as u64
    }
}

impl<T> ProbeArg for &mut T {
    /// The address.
    const SIZE: i32 = 8;
    #[inline(always)]
    fn probe_value(&self) -> u64 {
        &**self as *const T as usize as u64
    }
}

macro_rules! bytes_arg {
    ($($t:ty),*) => {$(
        impl ProbeArg for $t {
            /// The pointer (the first of the two probe arguments).
            const SIZE: i32 = 8;
            #[inline(always)]
            fn probe_value(&self) -> u64 {
                self.as_ptr() as usize as u64
            }
            const __WORDS: usize = 2;
            #[inline(always)]
            fn __probe_words(&self) -> [u64; 2] {
                [self.as_ptr() as usize as u64, self.len() as u64]
            }
        }
    )*};
}

bytes_arg!(&str, &mut str, &[u8], &mut [u8]);

bytes_arg!(String, Vec<u8>);

/// Compile-time check of [`ProbeArg::SIZE`], called by every probe site.
#[doc(hidden)]
pub const fn check_size(size: i32) {
    assert!(
        matches!(size, 1 | 2 | 4 | 8 | -1 | -2 | -4 | -8),
        "ProbeArg::SIZE must be one of 1, 2, 4, 8, -1, -2, -4, -8"
    );
}
