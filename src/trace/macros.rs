//! Formatting forms of the event calls: the name is formatted into the event's stack buffer,
//! and only when the tag is enabled (the arguments are not even evaluated otherwise).
//!
//! Each takes an optional [`Tracer`](crate::trace::Tracer) first, followed by `=>`
//! (`section!(IO => "read {}", f)`); without it they use [`APP`](crate::trace::APP).

/// Begins a section with a formatted name and returns its [`Section`](crate::trace::Section)
/// guard: `let _s = selftrace::trace::section!("frame {}", n);`, or with a tracer
/// `section!(IO => "read {}", f)`. Formats only when enabled.
#[macro_export]
macro_rules! __trace_section {
    ($tracer:expr => $fmt:literal $($args:tt)*) => {{
        let tracer: $crate::trace::Tracer = $tracer;
        if tracer.is_enabled() {
            tracer.__section_fmt(::core::format_args!($fmt $($args)*))
        } else {
            $crate::trace::Section::inactive()
        }
    }};
    ($fmt:literal $($args:tt)*) => {
        $crate::trace::section!($crate::trace::APP => $fmt $($args)*)
    };
}

/// Begins a section with a formatted name (`B|pid|name`); end it with
/// [`end_section`](crate::trace::end_section()). Formats only when enabled.
#[macro_export]
macro_rules! __trace_begin_section {
    ($tracer:expr => $fmt:literal $($args:tt)*) => {{
        let tracer: $crate::trace::Tracer = $tracer;
        if tracer.is_enabled() {
            tracer.__emit_fmt(b'B', ::core::format_args!($fmt $($args)*), ::core::option::Option::None)
        }
    }};
    ($fmt:literal $($args:tt)*) => {
        $crate::trace::begin_section!($crate::trace::APP => $fmt $($args)*)
    };
}

/// An instant event with a formatted name (`I|pid|name`). Formats only when enabled.
#[macro_export]
macro_rules! __trace_instant {
    ($tracer:expr => $fmt:literal $($args:tt)*) => {{
        let tracer: $crate::trace::Tracer = $tracer;
        if tracer.is_enabled() {
            tracer.__emit_fmt(b'I', ::core::format_args!($fmt $($args)*), ::core::option::Option::None)
        }
    }};
    ($fmt:literal $($args:tt)*) => {
        $crate::trace::instant!($crate::trace::APP => $fmt $($args)*)
    };
}

/// Begins an async section with a formatted name: `begin_async_section!(cookie, "load {}", f)`
/// writes `S|pid|name|cookie`; `begin_async_section!(IO => cookie, "load {}", f)` with a
/// tracer. Formats only when enabled.
#[macro_export]
macro_rules! __trace_begin_async_section {
    ($tracer:expr => $cookie:expr, $fmt:literal $($args:tt)*) => {{
        let tracer: $crate::trace::Tracer = $tracer;
        if tracer.is_enabled() {
            let cookie: i64 = $cookie;
            tracer.__emit_fmt(b'S', ::core::format_args!($fmt $($args)*), ::core::option::Option::Some(cookie))
        }
    }};
    ($cookie:expr, $fmt:literal $($args:tt)*) => {
        $crate::trace::begin_async_section!($crate::trace::APP => $cookie, $fmt $($args)*)
    };
}

/// Ends an async section with a formatted name: `end_async_section!(cookie, "load {}", f)`
/// writes `F|pid|name|cookie`; `end_async_section!(IO => cookie, "load {}", f)` with a
/// tracer. Formats only when enabled.
#[macro_export]
macro_rules! __trace_end_async_section {
    ($tracer:expr => $cookie:expr, $fmt:literal $($args:tt)*) => {{
        let tracer: $crate::trace::Tracer = $tracer;
        if tracer.is_enabled() {
            let cookie: i64 = $cookie;
            tracer.__emit_fmt(b'F', ::core::format_args!($fmt $($args)*), ::core::option::Option::Some(cookie))
        }
    }};
    ($cookie:expr, $fmt:literal $($args:tt)*) => {
        $crate::trace::end_async_section!($crate::trace::APP => $cookie, $fmt $($args)*)
    };
}
