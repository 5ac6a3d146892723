//! The `tracing` layer: spans as sections, events as instants (feature `tracing`).

use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

use super::format::floor_char_boundary;
use super::{writer, Tracer, TAG_APP};
use crate::sys;

/// How the [`MarkerLayer`] writes spans; see its docs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum SpanMode {
    /// Async spans when created inside an async task (tokio's, with the `tokio` feature) or
    /// first entered on another thread than their creator; thread spans otherwise.
    #[default]
    Auto,
    /// Every span is a thread span (`B`/`E` per enter).
    Thread,
    /// Every span is an async span (`S` at first enter, `F` at close).
    Async,
}

/// A `tracing_subscriber::Layer` that writes spans as sections and events as instants
/// (feature `tracing`).
///
/// * A span is a section. How it is written depends on where it is entered ([`SpanMode`]):
///   - **thread spans** (`B`/`E`): every enter writes `B|pid|name` and the matching exit writes
///     `E|pid`, on the entering thread. tracing's enter/exit always pair on one thread, so these
///     nest correctly. A span entered several times (a future polled on one thread) shows one
///     slice per enter.
///   - **async spans** (`S`/`F`): the first enter writes `S|pid|name|cookie` and the span's close
///     writes `F|pid|name|cookie`, with the span id as cookie. This is one slice from first poll to
///     drop for a task that hops between threads; individual enters are not written.
///   - [`SpanMode::Auto`] (the default): a span created inside a tokio task (with the `tokio`
///     feature: `tokio::task::try_id` says so) is an async span, so an `#[instrument]`ed future
///     or handler, entered at each of its polls, is one slice from its first poll to its drop,
///     not one per poll; otherwise it decides at the span's first enter: a span first entered on
///     the thread that created it is a thread span, one first entered on another thread (a
///     future spawned onto a runtime's worker) an async span. Other runtimes, or spans created
///     outside the task that polls them on its creating thread: [`SpanMode::Async`].
/// * An event is an instant, `I|pid|message field=value ...` (the metadata name when there is no
///   message), on the thread that emits it.
/// * A span's name is its metadata name followed by its fields (` key=value`, also those added
///   with `Span::record`), cut at a character boundary after
///   [`with_max_name_len`](MarkerLayer::with_max_name_len) bytes (256 by default); the same bound
///   applies to events.
///
/// Spans created while the layer's tag is disabled are never written (so sections stay balanced
/// when the tag is switched on later). This layer allocates (span names) and is not
/// async-signal-safe, like tracing itself.
///
/// ```no_run
/// use tracing_subscriber::prelude::*;
/// tracing_subscriber::registry()
///     .with(selftrace::trace::MarkerLayer::new())
///     .init();
/// let _s = tracing::info_span!("frame", n = 1).entered(); // B|pid|frame n=1
/// tracing::info!(bytes = 10, "sent");                     // I|pid|sent bytes=10
/// ```
#[must_use = "the layer does nothing until it is added to a subscriber"]
#[derive(Clone, Copy, Debug)]
pub struct MarkerLayer {
    tracer: Tracer,
    mode: SpanMode,
    max_name: usize,
}

impl Default for MarkerLayer {
    fn default() -> Self {
        MarkerLayer::new()
    }
}

impl MarkerLayer {
    /// A layer writing with tag [`TAG_APP`], in [`SpanMode::Auto`], names up to 256 bytes.
    pub fn new() -> MarkerLayer {
        MarkerLayer {
            tracer: Tracer::new(TAG_APP),
            mode: SpanMode::Auto,
            max_name: 256,
        }
    }

    /// Writes with `tracer`'s tag.
    pub fn with_tracer(mut self, tracer: Tracer) -> MarkerLayer {
        self.tracer = tracer;
        self
    }

    /// Chooses how spans are written.
    pub fn with_span_mode(mut self, mode: SpanMode) -> MarkerLayer {
        self.mode = mode;
        self
    }

    /// Bounds span and event names (name and fields) to `bytes` (at most
    /// [`MAX_EVENT`](super::MAX_EVENT) is written anyway).
    pub fn with_max_name_len(mut self, bytes: usize) -> MarkerLayer {
        self.max_name = bytes;
        self
    }
}

const UNDECIDED: u8 = 0;
const THREAD: u8 = 1;
const ASYNC: u8 = 2;
const ASYNC_BEGUN: u8 = 3;

/// What the layer keeps in a span's extensions.
struct SpanMarker {
    name: String,
    creator: i32,
    state: AtomicU8,
}

/// Which fields a [`Fields`] visitor appends.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pick {
    /// Every field as ` key=value` (spans).
    All,
    /// Only an event's `message`, bare.
    Message,
    /// Every field but `message`, as ` key=value`.
    NotMessage,
}

/// Appends fields to a name, bounded to `max` bytes.
struct Fields<'a> {
    out: &'a mut String,
    max: usize,
    pick: Pick,
}

impl Fields<'_> {
    fn push(&mut self, field: &Field, value: fmt::Arguments<'_>) {
        if self.out.len() >= self.max {
            return;
        }
        let is_message = field.name() == "message";
        let keep = match self.pick {
            Pick::All => true,
            Pick::Message => is_message,
            Pick::NotMessage => !is_message,
        };
        if !keep {
            return;
        }
        if self.pick == Pick::Message {
            let _ = self.out.write_fmt(value);
        } else {
            let _ = write!(self.out, " {}={}", field.name(), value);
        }
        let cut = floor_char_boundary(self.out, self.max);
        self.out.truncate(cut);
    }
}

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.push(field, format_args!("{value}"));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.push(field, format_args!("{value:?}"));
    }
}

impl MarkerLayer {
    fn bounded(&self, mut s: String) -> String {
        let cut = floor_char_boundary(&s, self.max_name);
        s.truncate(cut);
        s
    }
}

/// Whether the calling code runs inside an async task (tokio's, with the `tokio` feature).
fn in_async_task() -> bool {
    #[cfg(feature = "tokio")]
    {
        tokio::task::try_id().is_some()
    }
    #[cfg(not(feature = "tokio"))]
    {
        false
    }
}

impl<S> Layer<S> for MarkerLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if !self.tracer.is_enabled() {
            return;
        }
        let Some(span) = ctx.span(id) else { return };
        let mut name = self.bounded(attrs.metadata().name().to_owned());
        attrs.record(&mut Fields {
            out: &mut name,
            max: self.max_name,
            pick: Pick::All,
        });
        let state = match self.mode {
            SpanMode::Auto if in_async_task() => ASYNC,
            SpanMode::Auto => UNDECIDED,
            SpanMode::Thread => THREAD,
            SpanMode::Async => ASYNC,
        };
        span.extensions_mut().insert(SpanMarker {
            name,
            creator: sys::gettid(),
            state: AtomicU8::new(state),
        });
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut ext = span.extensions_mut();
        if let Some(m) = ext.get_mut::<SpanMarker>() {
            values.record(&mut Fields {
                out: &mut m.name,
                max: self.max_name,
                pick: Pick::All,
            });
        }
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let ext = span.extensions();
        let Some(m) = ext.get::<SpanMarker>() else {
            return;
        };
        let mut state = m.state.load(Relaxed);
        if state == UNDECIDED {
            let decided = if sys::gettid() == m.creator {
                THREAD
            } else {
                ASYNC
            };
            state = match m
                .state
                .compare_exchange(UNDECIDED, decided, Relaxed, Relaxed)
            {
                Ok(_) => decided,
                Err(now) => now,
            };
        }
        match state {
            THREAD => writer::emit_always(b'B', None, Some(&m.name), None),
            // Only the first enter of an async span writes its begin.
            ASYNC
                if m.state
                    .compare_exchange(ASYNC, ASYNC_BEGUN, Relaxed, Relaxed)
                    .is_ok() =>
            {
                writer::emit_always(b'S', None, Some(&m.name), Some(id.into_u64() as i64));
            }
            _ => {}
        }
    }

    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let ext = span.extensions();
        if let Some(m) = ext.get::<SpanMarker>() {
            if m.state.load(Relaxed) == THREAD {
                writer::emit_always(b'E', None, None, None);
            }
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let ext = span.extensions();
        if let Some(m) = ext.get::<SpanMarker>() {
            if m.state.load(Relaxed) == ASYNC_BEGUN {
                writer::emit_always(b'F', None, Some(&m.name), Some(id.into_u64() as i64));
            }
        }
    }

    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        if !self.tracer.is_enabled() {
            return;
        }
        let mut name = String::new();
        event.record(&mut Fields {
            out: &mut name,
            max: self.max_name,
            pick: Pick::Message,
        });
        if name.is_empty() {
            name.push_str(event.metadata().name());
            name = self.bounded(name);
        }
        event.record(&mut Fields {
            out: &mut name,
            max: self.max_name,
            pick: Pick::NotMessage,
        });
        writer::emit_always(b'I', None, Some(&name), None);
    }
}
