//! Formatting forms of the event calls: the name is formatted into the event's stack buffer,
//! and only when the tag is enabled (the arguments are not even evaluated otherwise).
//!
//! Each takes an optional [`Tracer`](crate::trace::Tracer) first (`section!(IO, "read {}", f)`),
//! else uses [`APP`](crate::trace::APP).

/// Begins a section with a formatted name and returns its [`Section`](crate::trace::Section)
/// guard: `let _s = selftrace::trace::section!("frame {}", n);`. Formats only when enabled.
#[macro_export]
macro_rules! __trace_section {
    ($fmt:literal $($args:tt)*) => {
        $crate::trace::section!($crate::trace::APP, $fmt $($args)*)
    };
    ($tracer:expr, $fmt:literal $($args:tt)*) => {{
        let tracer: $crate::trace::Tracer = $tracer;
        if tracer.is_enabled() {
            tracer.__section_fmt(::core::format_args!($fmt $($args)*))
        } else {
            $crate::trace::Section::inactive()
        }
    }};
}

/// Begins a section with a formatted name (`B|pid|name`); end it with
/// [`end_section`](crate::trace::end_section()). Formats only when enabled.
#[macro_export]
macro_rules! __trace_begin_section {
    ($fmt:literal $($args:tt)*) => {
        $crate::trace::begin_section!($crate::trace::APP, $fmt $($args)*)
    };
    ($tracer:expr, $fmt:literal $($args:tt)*) => {{
        let tracer: $crate::trace::Tracer = $tracer;
        if tracer.is_enabled() {
            tracer.__emit_fmt(b'B', ::core::format_args!($fmt $($args)*), ::core::option::Option::None)
        }
    }};
}

/// An instant event with a formatted name (`I|pid|name`). Formats only when enabled.
#[macro_export]
macro_rules! __trace_instant {
    ($fmt:literal $($args:tt)*) => {
        $crate::trace::instant!($crate::trace::APP, $fmt $($args)*)
    };
    ($tracer:expr, $fmt:literal $($args:tt)*) => {{
        let tracer: $crate::trace::Tracer = $tracer;
        if tracer.is_enabled() {
            tracer.__emit_fmt(b'I', ::core::format_args!($fmt $($args)*), ::core::option::Option::None)
        }
    }};
}

/// Begins an async section with a formatted name: `begin_async_section!(cookie, "load {}", f)`
/// writes `S|pid|name|cookie`. Formats only when enabled.
#[macro_export]
macro_rules! __trace_begin_async_section {
    ($cookie:expr, $fmt:literal $($args:tt)*) => {
        $crate::trace::begin_async_section!($crate::trace::APP, $cookie, $fmt $($args)*)
    };
    ($tracer:expr, $cookie:expr, $fmt:literal $($args:tt)*) => {{
        let tracer: $crate::trace::Tracer = $tracer;
        if tracer.is_enabled() {
            let cookie: i64 = $cookie;
            tracer.__emit_fmt(b'S', ::core::format_args!($fmt $($args)*), ::core::option::Option::Some(cookie))
        }
    }};
}

/// Ends an async section with a formatted name: `end_async_section!(cookie, "load {}", f)`
/// writes `F|pid|name|cookie`. Formats only when enabled.
#[macro_export]
macro_rules! __trace_end_async_section {
    ($cookie:expr, $fmt:literal $($args:tt)*) => {
        $crate::trace::end_async_section!($crate::trace::APP, $cookie, $fmt $($args)*)
    };
    ($tracer:expr, $cookie:expr, $fmt:literal $($args:tt)*) => {{
        let tracer: $crate::trace::Tracer = $tracer;
        if tracer.is_enabled() {
            let cookie: i64 = $cookie;
            tracer.__emit_fmt(b'F', ::core::format_args!($fmt $($args)*), ::core::option::Option::Some(cookie))
        }
    }};
}
