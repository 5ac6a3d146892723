//! [`SpanLayer`]: each thread's current tracing spans, kept where every report reads them.

use tracing::span::{Attributes, Id};
use tracing::Subscriber;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// A `tracing_subscriber::Layer` that keeps each thread's current spans (their names, the
/// innermost 8, and the async task's id where the runtime gives it: tokio's
/// `tokio::task::try_id`, with the `tokio` feature) in a record that dumps, crash reports and
/// watchdog reports read, async-signal-safely, and print under the thread's line:
///
/// ```text
/// thread "tokio-rt-worker" tid 4245, state S (sleeping), cpu 0.012s
///  in span: request > upload (task 17)
/// ```
///
/// An `#[instrument]`ed future enters its span at each poll and exits it after: while a task
/// is polled its worker's line names the task's spans; a task waiting at an `.await` is in no
/// thread's record. Costs a span lookup and a few relaxed stores per enter and exit.
///
/// ```
/// use tracing_subscriber::layer::SubscriberExt;
/// let subscriber = tracing_subscriber::registry().with(selftrace::tasks::SpanLayer::new());
/// tracing::subscriber::set_global_default(subscriber).unwrap();
/// ```
#[derive(Debug, Default, Clone, Copy)]
pub struct SpanLayer {
    _private: (),
}

impl SpanLayer {
    /// The layer.
    pub fn new() -> SpanLayer {
        SpanLayer { _private: () }
    }
}

/// The current task's id, where the runtime gives one.
#[inline]
fn task_id() -> Option<u64> {
    #[cfg(feature = "tokio")]
    {
        tokio::task::try_id().and_then(|id| super::task_id_u64(&id))
    }
    #[cfg(not(feature = "tokio"))]
    {
        None
    }
}

impl<S> Layer<S> for SpanLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _ctx: Context<'_, S>) {
        crate::report::spans::publish_name(id.into_u64(), attrs.metadata().name());
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        let id = id.into_u64();
        let name = match crate::report::spans::published_name(id) {
            Some(name) => name,
            None => match ctx.metadata(&Id::from_u64(id)) {
                Some(meta) => meta.name(),
                None => return,
            },
        };
        crate::report::spans::enter(id, name, task_id());
    }

    fn on_exit(&self, id: &Id, _ctx: Context<'_, S>) {
        crate::report::spans::exit(id.into_u64());
    }

    fn on_close(&self, id: Id, _ctx: Context<'_, S>) {
        crate::report::spans::retract_name(id.into_u64());
    }
}

#[cfg(all(test, feature = "tokio"))]
mod tests {
    /// The id read from the hash is the one tokio prints.
    #[test]
    fn task_ids_read_as_tokio_prints_them() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        for _ in 0..3 {
            let (printed, read) = rt.block_on(async {
                tokio::spawn(async {
                    let id = tokio::task::id();
                    (id.to_string(), crate::tasks::task_id_u64(&id))
                })
                .await
                .unwrap()
            });
            assert_eq!(Some(printed), read.map(|v| v.to_string()));
        }
    }
}
