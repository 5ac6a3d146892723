//! The `tracing` layer (feature `tracing`): spans become sections, events instants, read back
//! from a private instance as exact lines.
#![cfg(all(feature = "tracing", feature = "tracefs"))]

mod markers_util;

use markers_util::*;
use selftrace::trace::{MarkerLayer, SpanMode};
use tracing::{dispatcher, Dispatch};
use tracing_subscriber::prelude::*;

fn dispatch(layer: MarkerLayer) -> Dispatch {
    Dispatch::new(tracing_subscriber::registry().with(layer))
}

#[test]
fn nested_spans_are_sections_and_events_are_instants() {
    let Some(inst) = setup("nested_spans_are_sections_and_events_are_instants") else {
        return;
    };
    let t = token("layer");
    let p = pid();
    dispatcher::with_default(&dispatch(MarkerLayer::new()), || {
        let outer = tracing::info_span!("outer", t = %t, n = 1, late = tracing::field::Empty);
        outer.record("late", "yes");
        let _o = outer.enter();
        {
            let inner = tracing::info_span!("inner", t = %t, s = "a|b");
            let _i = inner.enter();
            tracing::info!(t = %t, answer = 42, "hello {}", "world");
            tracing::warn!(t = %t, dbg = ?Some(3), "second");
        }
        // Entered twice on its creating thread: two slices.
        let again = tracing::info_span!("again", t = %t);
        drop(again.enter());
        drop(again.enter());
    });
    assert_eq!(
        texts_of(&inst, tid()),
        [
            format!("B|{p}|outer t={t} n=1 late=yes"),
            format!("B|{p}|inner t={t} s=a!b"),
            format!("I|{p}|hello world t={t} answer=42"),
            format!("I|{p}|second t={t} dbg=Some(3)"),
            format!("E|{p}"),
            format!("B|{p}|again t={t}"),
            format!("E|{p}"),
            format!("B|{p}|again t={t}"),
            format!("E|{p}"),
            format!("E|{p}"),
        ]
    );
}

#[test]
fn spans_entered_on_another_thread_are_async_slices() {
    let Some(inst) = setup("spans_entered_on_another_thread_are_async_slices") else {
        return;
    };
    let t = token("task");
    let p = pid();
    let d = dispatch(MarkerLayer::new());
    // Created here, polled on a worker (twice), dropped here: like a spawned task.
    let span = dispatcher::with_default(&d, || tracing::info_span!("task", t = %t));
    let id = span.id().unwrap().into_u64();
    let d2 = d.clone();
    let tw = t.clone();
    let (span, worker) = std::thread::spawn(move || {
        dispatcher::with_default(&d2, || {
            {
                let _e = span.enter();
                tracing::info!(t = %tw, "polled");
            }
            drop(span.enter());
        });
        (span, tid())
    })
    .join()
    .unwrap();
    drop(span);
    let evs: Vec<_> = inst
        .read_markers()
        .unwrap()
        .into_iter()
        .filter(|e| e.name.contains(&t))
        .map(|e| (e.tid, e.text))
        .collect();
    assert_eq!(
        evs,
        [
            (worker, format!("S|{p}|task t={t}|{id}")),
            (worker, format!("I|{p}|polled t={t}")),
            (tid(), format!("F|{p}|task t={t}|{id}")),
        ]
    );

    // Forced modes, and the name bound.
    let t2 = token("forced");
    dispatcher::with_default(
        &dispatch(
            MarkerLayer::new()
                .with_span_mode(SpanMode::Async)
                .with_max_name_len(30),
        ),
        || {
            let s = tracing::info_span!("forced", t = %t2, pad = "€€€€€€€€€€€€€€€€€€€€");
            let id = s.id().unwrap().into_u64();
            drop(s.enter());
            drop(s);
            let name = &format!("forced t={t2} pad=€€€€€€€€€€€€€")[..];
            let name = &name[..selftrace_floor(name, 30)];
            assert_eq!(
                texts_of(&inst, tid())
                    .into_iter()
                    .filter(|x| x.contains(&t2))
                    .collect::<Vec<_>>(),
                [format!("S|{p}|{name}|{id}"), format!("F|{p}|{name}|{id}")]
            );
        },
    );
}

fn selftrace_floor(s: &str, max: usize) -> usize {
    let mut n = max.min(s.len());
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    n
}

/// Issue 47: an `#[instrument]`ed future in a tokio task, polled several times on one thread
/// (a current-thread runtime), is one async slice from its first poll to its drop, not a slice
/// per poll.
#[cfg(feature = "tokio")]
#[test]
fn an_instrumented_future_in_a_task_is_one_async_slice() {
    use tracing::Instrument;
    let Some(inst) = setup("an_instrumented_future_in_a_task_is_one_async_slice") else {
        return;
    };
    let t = token("request");
    let p = pid();
    let d = dispatch(MarkerLayer::new());
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let tt = t.clone();
    let id = dispatcher::with_default(&d, || {
        rt.block_on(async move {
            tokio::spawn(async move {
                let span = tracing::info_span!("request", t = %tt);
                let id = span.id().unwrap().into_u64();
                async {
                    for _ in 0..3 {
                        tokio::task::yield_now().await;
                    }
                }
                .instrument(span)
                .await;
                id
            })
            .await
            .unwrap()
        })
    });
    assert_eq!(
        texts_of(&inst, tid())
            .into_iter()
            .filter(|x| x.contains(&t))
            .collect::<Vec<_>>(),
        [
            format!("S|{p}|request t={t}|{id}"),
            format!("F|{p}|request t={t}|{id}")
        ]
    );
}
