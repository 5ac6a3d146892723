//! USDT probes: static probe points that bpftrace, perf, gdb, SystemTap and the kernel's
//! `uprobe_events` attach to, costing a `nop` when nobody listens.
//!
//! ```
//! let (user, bytes, path) = (42u32, -7i64, "/index.html");
//! // Arguments are evaluated every time, like a function call's.
//! selftrace::probe!(myapp, request, user, bytes, path);
//! // Arguments are evaluated only while a tracer is attached.
//! selftrace::probe_lazy!(myapp, request_slow, user, format!("{path}?{bytes}"));
//! if selftrace::probe_enabled!(myapp, request) {
//!     // expensive preparation only when traced
//! }
//!
//! #[selftrace::usdt::probe]
//! fn handle(user: u32, path: &str) -> i32 {
//!     0
//! }
//! handle(user, path);
//! ```
//!
//! ```sh
//! bpftrace -e 'usdt:./app:myapp:request { printf("%d %d %s\n", arg0, arg1, str(arg2, arg3)); }' -c ./app
//! ```
//!
//! # The macros
//!
//! * [`probe!`](crate::probe)`(provider, name, args...)`: one probe site. Its arguments are
//!   evaluated exactly once each time execution reaches the site, whether a tracer is attached
//!   or not (they are borrowed, never moved). 0 to 12 arguments; more is a compile error.
//! * [`probe_lazy!`](crate::probe_lazy)`(provider, name, args...)`: the same probe, but the
//!   arguments are evaluated only when the probe's semaphore is non-zero (a tracer is
//!   attached); otherwise the site costs one load and a branch.
//! * [`probe_enabled!`](crate::probe_enabled)`(provider, name)`: `true` while a tracer is
//!   attached to `provider:name`.
//! * [`#[probe]`](macro@probe) on a function (free function, method, generic function, `extern
//!   "C"` function of a cdylib): `provider:fn_name` at entry with the arguments,
//!   `provider:fn_name__return` at return (with the value when it is a scalar, a pointer, a
//!   reference or `&str`). `provider` defaults to the crate's name; `#[probe(provider = "p",
//!   name = "n")]` overrides. On an `async fn` the entry probe fires when the future is first
//!   polled and the return probe when it completes.
//!
//! Why `#[selftrace::usdt::probe]` and not `#[selftrace::probe]`: Rust has one macro namespace
//! per module, so `selftrace::probe!` (the site) and an attribute of the same name cannot both
//! exist at the crate root on stable Rust (declarative attribute macros are unstable). The
//! attribute lives in this module instead.
//!
//! Provider and name are identifiers (or string literals) of 1 to 64 ASCII letters, digits and
//! `_`. Argument types: see [`ProbeArg`]; `&str`, `&[u8]`, `String` and `Vec<u8>` are two
//! probe arguments (pointer, length).
//!
//! # What is emitted
//!
//! Per site, a `nop` and a `.note.stapsdt` note naming it, with the exact size and sign of
//! every argument in the operand syntax sys/sdt.h writes on the target (`-4@%rdi` for an `i32`
//! in `rdi` on x86-64, `-4@x0` on aarch64). Per `provider:name` and linked object
//! (executable or shared library), one `u16` semaphore in the section `.probes`, shared by all
//! sites of that probe in every crate of the object: tracers raise it when they attach. See the
//! macro crate's `site.rs` for the note's layout.
//!
//! At run time, [`probes()`] lists the probes compiled into the program with their semaphores;
//! [`read_probes`] reads the notes of any ELF file (of either architecture, on any host) and
//! computes the file offsets the kernel needs.
//!
//! # Architectures
//!
//! Notes are emitted on x86-64 and aarch64 ([`NOTES`]: `cfg(any(target_arch = "x86_64",
//! target_arch = "aarch64"))`). Elsewhere every macro compiles to nothing observable: the
//! arguments of `probe!` are still type-checked and evaluated (so a program behaves the same on
//! every target), but no note, `nop` or semaphore is emitted, `probe_enabled!` and
//! `probe_lazy!`'s condition are `false`, and [`probes()`] lists none.
//!
//! # Linkers
//!
//! Works under rust-lld (Rust's default linker) as under GNU ld: `.stapsdt.base` is kept and
//! executable, `.probes` is page-aligned (so `bpftrace -c`, `perf record -- cmd` and
//! enable-then-exec raise the semaphore), and the notes of code removed by `--gc-sections` go with
//! it.
//!
//! # With the tools
//!
//! `examples/probes.rs`, watched as root:
//!
//! ```sh
//! cargo build --release --example probes
//! bpftrace -e 'usdt:./target/release/examples/probes:demo:tick { printf("tick %d %s\n", arg0, str(arg1, arg2)); }' \
//!     -c './target/release/examples/probes 5'
//! bpftrace -l 'usdt:./target/release/examples/probes:*'
//! gdb -batch -ex 'break -probe-stap demo:handle' -ex run -ex 'print $_probe_arg0' \
//!     --args ./target/release/examples/probes 1
//! perf probe -x ./target/release/examples/probes sdt_demo:tick
//! perf record -e sdt_demo:tick -- ./target/release/examples/probes 1 && perf script
//! perf probe -d 'sdt_demo:*'
//! ```
//!
//! A program can also attach the kernel to its own probes (feature `tracefs`):
//! `tracefs::uprobe::UprobeEvent::for_probe` registers a uprobe with the probe's semaphore as
//! reference counter and typed fetch arguments (removed on drop), to be enabled in a private
//! `tracefs::Instance`. The cost of a disabled probe is in the repository's docs/benchmarks.md.
#![allow(unsafe_code)]

mod arg;
pub(crate) mod notes;

pub use arg::ProbeArg;
pub use notes::{parse_probes, read_probes, ArgSpec, ProbeNote, ReadError};
pub use selftrace_usdt_macros::probe;

use std::collections::BTreeMap;

/// Whether this target emits USDT notes (x86-64 and aarch64; see [Architectures](self#architectures)).
pub const NOTES: bool = cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));

/// Fires the USDT probe `provider:name` with up to 12 arguments.
///
/// The arguments are evaluated (borrowed) every time; see [`probe_lazy!`](crate::probe_lazy)
/// to evaluate them only while a tracer is attached. See [`usdt`](crate::usdt).
///
/// ```
/// let x = -5i32;
/// selftrace::probe!(demo, tick, x, 7u64, "text");
/// ```
#[macro_export]
macro_rules! probe {
    ($($tokens:tt)*) => {
        $crate::usdt::__private::__probe_site!(($crate) eager $($tokens)*)
    };
}

/// Fires the USDT probe `provider:name`, evaluating the arguments only while a tracer is
/// attached (the probe's semaphore is non-zero). Disabled, it costs a load and a branch.
///
/// ```
/// selftrace::probe_lazy!(demo, expensive, format!("{}", 1 + 1));
/// ```
#[macro_export]
macro_rules! probe_lazy {
    ($($tokens:tt)*) => {
        $crate::usdt::__private::__probe_site!(($crate) lazy $($tokens)*)
    };
}

/// `true` while a tracer is attached to the USDT probe `provider:name` of this object (its
/// semaphore is non-zero). The probe need not have a [`probe!`](crate::probe) site of its own.
///
/// ```
/// if selftrace::probe_enabled!(demo, tick) {
///     println!("traced");
/// }
/// ```
#[macro_export]
macro_rules! probe_enabled {
    ($($tokens:tt)*) => {
        $crate::usdt::__private::__probe_site!(($crate) enabled $($tokens)*)
    };
}

/// Implementation details of the macros.
#[doc(hidden)]
pub mod __private {
    pub use super::arg::check_size;
    pub use linkme;
    pub use selftrace_usdt_macros::__probe_site;

    /// Runs the body of a `#[probe]` function: the `FnOnce` bound lets the closure return
    /// borrows of what it captured.
    #[inline(always)]
    pub fn call_once<R>(f: impl FnOnce() -> R) -> R {
        f()
    }

    /// One probe site (or `probe_enabled!` use), registered at link time.
    pub struct Site {
        /// Provider.
        pub provider: &'static str,
        /// Name.
        pub name: &'static str,
        /// Whether the site fires the probe (and so has a note); `false` for `probe_enabled!`.
        pub fires: bool,
        /// Returns the address of the probe's semaphore in this object.
        pub semaphore: fn() -> *const u16,
    }

    /// Every site linked into the program.
    #[linkme::distributed_slice]
    pub static PROBE_SITES: [Site];

    /// A probe in a public function that programs do not call: the linker's `--gc-sections`
    /// removes the function, and its note must go with it (tests/usdt/notes.rs checks that
    /// `selftrace:gc_canary` is absent from binaries).
    #[inline(never)]
    pub fn gc_canary(x: u64) {
        crate::probe!(selftrace, gc_canary, x);
    }

    /// A site of `selftrace_test:cross_crate` in this crate; the test program fires the same
    /// probe from its own crate, and both sites must share one semaphore
    /// (tests/usdt/notes.rs).
    #[inline(never)]
    pub fn cross_crate(x: u32) {
        crate::probe!(selftrace_test, cross_crate, x);
    }
}

/// A probe compiled into the running program, as [`probes()`] lists it.
///
/// Only [`probes()`] makes one (its fields are private): [`Probe::is_enabled`] reads the
/// semaphore at the address it holds, which must be a probe's own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    provider: &'static str,
    name: &'static str,
    semaphore: usize,
    enabled: bool,
    sites: usize,
    arguments: Vec<ArgSpec>,
}

impl Probe {
    /// The provider.
    pub fn provider(&self) -> &'static str {
        self.provider
    }

    /// The probe's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The address of its semaphore in memory.
    pub fn semaphore(&self) -> usize {
        self.semaphore
    }

    /// Whether a tracer was attached (the semaphore was non-zero) when [`probes()`] ran; see
    /// [`Probe::is_enabled`] for now.
    pub fn was_enabled(&self) -> bool {
        self.enabled
    }

    /// How many sites registered it (`probe!`, `probe_lazy!`, `probe_enabled!` uses and
    /// `#[probe]` functions; a site in a generic function counts once).
    pub fn sites(&self) -> usize {
        self.sites
    }

    /// The argument types of its first site as the note records them (`-4@%rdi`: a signed
    /// 4-byte value in `rdi`), read from the object's file; empty for a probe known only from
    /// `probe_enabled!`, or when the file could not be read.
    pub fn arguments(&self) -> &[ArgSpec] {
        &self.arguments
    }

    /// Whether a tracer is attached now.
    pub fn is_enabled(&self) -> bool {
        // SAFETY: `semaphore` is the address of a live, aligned u16 static of this program:
        // only `probes()` builds a `Probe` (the fields are private), from the address the
        // probe's own site registered; volatile because tracers write it from outside.
        unsafe { core::ptr::read_volatile(self.semaphore as *const u16) != 0 }
    }
}

/// Every USDT probe compiled into the running program (the executable and the shared
/// libraries it has loaded that use selftrace), one entry per probe and object, sorted by
/// provider and name. Probes whose every site was removed by the linker as dead code are left
/// out; a probe used only through `probe_enabled!` is listed (without arguments).
///
/// Reads each object's file once to fill [`Probe::arguments`]. Not async-signal-safe.
pub fn probes() -> Vec<Probe> {
    // Per semaphore: the probe, and whether some site fires it.
    let mut by_sem: BTreeMap<usize, (Probe, bool)> = BTreeMap::new();
    for site in __private::PROBE_SITES.iter() {
        let sem = (site.semaphore)() as usize;
        let entry = by_sem.entry(sem).or_insert_with(|| {
            (
                Probe {
                    provider: site.provider,
                    name: site.name,
                    semaphore: sem,
                    enabled: false,
                    sites: 0,
                    arguments: Vec::new(),
                },
                false,
            )
        });
        entry.0.sites += 1;
        entry.1 |= site.fires;
    }
    let (mut out, fires): (Vec<Probe>, Vec<bool>) = by_sem.into_values().unzip();
    for p in &mut out {
        p.enabled = p.is_enabled();
    }
    let noted = fill_arguments(&mut out);
    // The registry keeps entries of sites whose code the linker removed (their notes are gone
    // with the code); a probe whose firing sites all went is not in the program.
    let mut keep = fires
        .iter()
        .zip(&noted)
        .map(|(&f, &n)| !f || n != Some(false));
    out.retain(|_| keep.next().unwrap_or(true));
    out.sort_by(|a, b| (a.provider, a.name, a.semaphore).cmp(&(b.provider, b.name, b.semaphore)));
    out
}

/// Fills [`Probe::arguments`] from the notes of the objects the semaphores live in. Returns,
/// per probe, whether a note names it (`None`: its object's file could not be read).
fn fill_arguments(probes: &mut [Probe]) -> Vec<Option<bool>> {
    let mut noted = vec![None; probes.len()];
    use findshlibs::{Segment, SharedLibrary, TargetSharedLibrary};
    /// A loaded object: file name, load bias, mapped address ranges.
    type Object = (String, u64, Vec<(u64, u64)>);
    let mut objects: Vec<Object> = Vec::new();
    TargetSharedLibrary::each(|lib| {
        let bias = lib.virtual_memory_bias().0 as u64;
        let ranges = lib
            .segments()
            .map(|s| {
                let start = s.actual_virtual_memory_address(lib).0 as u64;
                (start, start + s.len() as u64)
            })
            .collect();
        let name = lib.name().to_string_lossy().into_owned();
        objects.push((name, bias, ranges));
    });
    for (name, bias, ranges) in objects {
        let mine: Vec<usize> = (0..probes.len())
            .filter(|&i| {
                let a = probes[i].semaphore as u64;
                ranges.iter().any(|&(s, e)| a >= s && a < e)
            })
            .collect();
        if mine.is_empty() {
            continue;
        }
        let path = if name.is_empty() {
            "/proc/self/exe".to_string()
        } else {
            name
        };
        let Ok(notes) = read_probes(&path) else {
            continue;
        };
        for i in mine {
            let p = &mut probes[i];
            let found = notes.iter().find(|n| {
                n.semaphore != 0
                    && n.semaphore.wrapping_add(bias) == p.semaphore as u64
                    && n.provider == p.provider
                    && n.name == p.name
            });
            if let Some(n) = found {
                p.arguments = n.arguments.clone();
            }
            noted[i] = Some(found.is_some());
        }
    }
    noted
}
