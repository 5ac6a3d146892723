//! The costs of watching async work (issue 47), each beside its baseline and a peer:
//!
//! * **per poll**: a future that yields 64 times, polled to completion bare, wrapped in
//!   `TaskWatch::run` (marks the polling thread), and wrapped in tokio-metrics'
//!   `TaskMonitor::instrument` (the peer: per-poll timing of a task on stable tokio);
//! * **per park/unpark**: the worker hooks of `tasks::configure` (`on_thread_park` +
//!   `on_thread_unpark`) against an empty hook pair called the way tokio calls hooks (through
//!   an `Arc<dyn Fn()>`);
//! * **per span enter/exit**: tracing-subscriber's registry with a layer that does nothing, and
//!   with `tasks::SpanLayer` (the record every report reads) instead.
//!
//! Each is measured by criterion and then interleaved (short batches alternated, the fastest
//! batch of each kept; thread CPU time), printed as one line per comparison.
//!
//! `cargo bench --bench tasks --features tokio,tracing`

use std::future::Future;
use std::hint::black_box;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use criterion::{Criterion, Throughput};

#[path = "cpu_time.rs"]
mod cpu_time;
use cpu_time::{cpu, thread_cpu_time};

/// Polls per future.
const POLLS: u32 = 64;

/// Pending `left` times (waking itself each time), then ready.
struct Yields {
    left: u32,
}

impl Future for Yields {
    type Output = u32;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<u32> {
        if self.left == 0 {
            return Poll::Ready(black_box(7));
        }
        self.left -= 1;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// Polls `f` to completion with a no-op waker.
fn run<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
    }
}

fn polls(c: &mut Criterion) {
    let watch =
        selftrace::watchdog::watch_task("bench", Duration::from_secs(3600)).expect("watch_task");
    let monitor = tokio_metrics::TaskMonitor::new();
    let mut g = c.benchmark_group("poll");
    g.throughput(Throughput::Elements(u64::from(POLLS) + 1));
    g.bench_function("bare", |b| cpu(b, || run(Yields { left: POLLS })));
    g.bench_function("selftrace TaskWatch::run", |b| {
        cpu(b, || run(watch.clone().run(Yields { left: POLLS })))
    });
    g.bench_function("tokio-metrics TaskMonitor::instrument", |b| {
        cpu(b, || run(monitor.instrument(Yields { left: POLLS })))
    });
    g.finish();
    let per = (POLLS + 1) as f64;
    let [bare, ours, peer] = interleaved([
        &mut || {
            run(Yields { left: POLLS });
        },
        &mut || {
            run(watch.clone().run(Yields { left: POLLS }));
        },
        &mut || {
            run(monitor.instrument(Yields { left: POLLS }));
        },
    ]);
    println!(
        "interleaved, per poll: bare {:.2} ns, TaskWatch::run +{:.2} ns, tokio-metrics +{:.2} ns",
        bare / per,
        (ours - bare) / per,
        (peer - bare) / per
    );
}

fn hooks(c: &mut Criterion) {
    selftrace::tasks::prepare(Some(Duration::from_secs(3600))).expect("prepare");
    // This thread is a worker from its first park on.
    selftrace::tasks::on_thread_park();
    let empty: Arc<dyn Fn() + Send + Sync> = Arc::new(|| {});
    let park: Arc<dyn Fn() + Send + Sync> = Arc::new(selftrace::tasks::on_thread_park);
    let unpark: Arc<dyn Fn() + Send + Sync> = Arc::new(selftrace::tasks::on_thread_unpark);
    let mut g = c.benchmark_group("park+unpark");
    g.bench_function("empty hooks", |b| {
        cpu(b, || {
            black_box(&empty)();
            black_box(&empty)();
        })
    });
    g.bench_function("selftrace tasks hooks", |b| {
        cpu(b, || {
            black_box(&park)();
            black_box(&unpark)();
        })
    });
    g.finish();
    let [base, ours] = interleaved([
        &mut || {
            black_box(&empty)();
            black_box(&empty)();
        },
        &mut || {
            black_box(&park)();
            black_box(&unpark)();
        },
    ]);
    println!(
        "interleaved, per park+unpark: empty hooks {base:.2} ns, selftrace +{:.2} ns",
        ours - base
    );
    selftrace::tasks::on_thread_stop();
}

/// A layer that does nothing on enter and exit: what any layer costs in a registry.
struct EmptyLayer;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for EmptyLayer {
    fn on_enter(&self, _: &tracing::span::Id, _: tracing_subscriber::layer::Context<'_, S>) {}
    fn on_exit(&self, _: &tracing::span::Id, _: tracing_subscriber::layer::Context<'_, S>) {}
}

fn spans(c: &mut Criterion) {
    use tracing_subscriber::layer::SubscriberExt;
    let bare = tracing::Dispatch::new(tracing_subscriber::registry().with(EmptyLayer));
    let ours = tracing::Dispatch::new(
        tracing_subscriber::registry().with(selftrace::tasks::SpanLayer::new()),
    );
    let mut g = c.benchmark_group("span enter+exit");
    for (name, d) in [
        ("registry + an empty layer", &bare),
        ("registry + SpanLayer", &ours),
    ] {
        tracing::dispatcher::with_default(d, || {
            let span = tracing::info_span!("request");
            g.bench_function(name, |b| cpu(b, || drop(black_box(&span).enter())));
        });
    }
    g.finish();
    let spans: Vec<tracing::Span> = [&bare, &ours]
        .iter()
        .map(|d| tracing::dispatcher::with_default(d, || tracing::info_span!("request")))
        .collect();
    let [base, with] = interleaved([&mut || drop(black_box(&spans[0]).enter()), &mut || {
        drop(black_box(&spans[1]).enter())
    }]);
    println!(
        "interleaved, per span enter+exit: registry with an empty layer {base:.2} ns, SpanLayer +{:.2} ns",
        with - base
    );
}

/// Each closure's fastest time (ns per call) over 200 rounds of batches of 2,000 calls,
/// alternated.
fn interleaved<const N: usize>(fs: [&mut dyn FnMut(); N]) -> [f64; N] {
    const BATCH: u32 = 2000;
    let mut fs = fs;
    let mut best = [Duration::MAX; N];
    for _ in 0..200 {
        for (f, best) in fs.iter_mut().zip(best.iter_mut()) {
            let t0 = thread_cpu_time();
            for _ in 0..BATCH {
                f();
            }
            *best = (*best).min(thread_cpu_time() - t0);
        }
    }
    best.map(|d| d.as_nanos() as f64 / f64::from(BATCH))
}

fn main() {
    selftrace::init().expect("init");
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(30)
        .configure_from_args();
    polls(&mut c);
    hooks(&mut c);
    spans(&mut c);
    c.final_summary();
}
