//! The task dump: every task spawned through [`spawn`] (or wrapped in [`traced`]), idle or
//! running, with where it waits.
//!
//! ```text
//! ------------[ selftrace: tasks ]------------
//! 3 tasks: 2 idle, 1 running
//!
//! task 12 spawned at src/main.rs:40:5, idle (polled 3 times)
//!  #0 svc::handle Suspend1 at src/main.rs:31
//!  #1 svc::fetch Suspend0 at src/main.rs:52
//!  #2 tokio::time::sleep::Sleep
//!
//! task 13 spawned at src/main.rs:41:5, running on thread "tokio-rt-worker" tid 4245
//! Call Trace:
//!  ...
//! ---[ end of tasks ]---
//! ```
//!
//! An idle task's chain is read from its future's memory with the layouts in the program's
//! DWARF ([`super::layout`]), without waiting for the task: a task that never yields is shown
//! as running, with its worker's stack. Normal context.

use super::layout::{await_chain, Awaiting};
use crate::fork::ForkMutex;
use core::future::Future;
use core::pin::Pin;
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use core::task::{Context, Poll};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::panic::Location;
use std::sync::Arc;

/// What the dump knows of one task.
struct Entry {
    /// Where it was spawned (wrapped).
    spawned_at: &'static Location<'static>,
    /// Its future's `poll` (`<F as Future>::poll`), whose DWARF gives the future's type.
    poll: usize,
    /// Its future's address (boxed: it never moves).
    root: AtomicUsize,
    /// Polls begun and ended: odd while it is being polled.
    polls: AtomicU64,
    /// The thread polling it (0: none).
    tid: AtomicI32,
    /// tokio's task id (+ 1; 0: not known yet).
    task_id: AtomicU64,
    /// Set when the task's future is about to be freed: a chain read meanwhile is discarded.
    gone: AtomicBool,
}

/// The traced tasks by spawn order.
static TASKS: ForkMutex<BTreeMap<u64, Arc<Entry>>> = ForkMutex::new(BTreeMap::new());
static NEXT: AtomicU64 = AtomicU64::new(1);

/// A future traced for the task dump: [`traced`] makes one.
#[must_use = "futures do nothing unless polled"]
pub struct Traced<F> {
    key: u64,
    entry: Arc<Entry>,
    /// Boxed: its address, which the dump reads it at, is known from the start and never
    /// changes.
    future: Pin<Box<F>>,
}

impl<F> std::fmt::Debug for Traced<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Traced")
            .field("spawned_at", &self.entry.spawned_at)
            .finish_non_exhaustive()
    }
}

/// `future`, listed in the task dump ([`dump_to`]) while it exists, with the caller's
/// location as its spawn location: for a task spawned another way than `tasks::spawn`
/// (`tokio::spawn(selftrace::tasks::traced(fut))`, another runtime). Costs an allocation and a
/// lock when made and dropped (the future is boxed), and per poll two relaxed stores, an
/// atomic add and a thread-local read.
#[track_caller]
pub fn traced<F: Future>(future: F) -> Traced<F> {
    let future = Box::pin(future);
    let entry = Arc::new(Entry {
        spawned_at: Location::caller(),
        poll: poll_address::<F>(),
        root: AtomicUsize::new(&*future as *const F as usize),
        polls: AtomicU64::new(0),
        tid: AtomicI32::new(0),
        task_id: AtomicU64::new(0),
        gone: AtomicBool::new(false),
    });
    let _ = crate::watchdog::TASK_OF_THREAD.set(task_of_thread);
    let key = NEXT.fetch_add(1, Ordering::Relaxed);
    TASKS
        .lock_or_reset(BTreeMap::new)
        .insert(key, entry.clone());
    Traced { key, entry, future }
}

/// `task 17 spawned at src/main.rs:40:5`: the traced task thread `tid` is polling, if any.
fn task_of_thread(tid: i32) -> Option<String> {
    let tasks = TASKS.lock_or_reset(BTreeMap::new);
    let e = tasks
        .values()
        .find(|e| tid > 0 && e.tid.load(Ordering::Relaxed) == tid)?;
    let mut s = String::from("task");
    if let Some(id) = e.task_id.load(Ordering::Relaxed).checked_sub(1) {
        let _ = write!(s, " {id}");
    }
    let at = e.spawned_at;
    let _ = write!(s, " spawned at {}:{}:{}", at.file(), at.line(), at.column());
    Some(s)
}

/// The address of `<F as Future>::poll`.
fn poll_address<F: Future>() -> usize {
    let f: fn(Pin<&mut F>, &mut Context<'_>) -> Poll<F::Output> = <F as Future>::poll;
    f as usize
}

/// `tokio::spawn` of `future`, traced for the task dump ([`traced`]).
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
#[track_caller]
pub fn spawn<F>(future: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(traced(future))
}

impl<F> Drop for Traced<F> {
    fn drop(&mut self) {
        // Before the future is freed (the fields drop after this): a dump reading it now
        // sees this afterwards and discards what it read.
        self.entry.gone.store(true, Ordering::SeqCst);
        TASKS.lock_or_reset(BTreeMap::new).remove(&self.key);
    }
}

/// Marks the end of a poll, also when the poll panics.
struct Polling<'a>(&'a Entry);

impl Drop for Polling<'_> {
    fn drop(&mut self) {
        self.0.tid.store(0, Ordering::Relaxed);
        self.0.polls.fetch_add(1, Ordering::Release);
    }
}

impl<F: Future> Future for Traced<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let e = &*this.entry;
        if e.task_id.load(Ordering::Relaxed) == 0 {
            e.task_id
                .store(current_task_id().map_or(0, |t| t + 1), Ordering::Relaxed);
        }
        e.polls.fetch_add(1, Ordering::Acquire);
        e.tid.store(crate::fork::cached_tid(), Ordering::Relaxed);
        let _polling = Polling(e);
        this.future.as_mut().poll(cx)
    }
}

fn current_task_id() -> Option<u64> {
    #[cfg(feature = "tokio")]
    {
        tokio::task::try_id().and_then(|id| super::task_id_u64(&id))
    }
    #[cfg(not(feature = "tokio"))]
    {
        None
    }
}

/// What [`dump_to`] saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TaskSummary {
    /// Tasks listed.
    pub tasks: usize,
    /// Idle tasks whose chain of awaits was read.
    pub idle: usize,
    /// Tasks being polled (shown with their worker's stack).
    pub running: usize,
    /// Tasks not polled yet.
    pub not_started: usize,
    /// Idle tasks whose chain could not be read (the reason is in the dump).
    pub no_chain: usize,
    /// Tasks that finished while the dump read them (listed as such, without a chain).
    pub finished: usize,
}

/// Writes every traced task (see the module docs) to `out`. Normal context: reads DWARF (the
/// first dump parses the program's), captures the stacks of the threads polling tasks.
///
/// # Errors
/// Those of `out`.
pub fn dump_to(mut out: impl std::io::Write) -> std::io::Result<TaskSummary> {
    let tasks: Vec<(u64, Arc<Entry>)> = TASKS
        .lock_or_reset(BTreeMap::new)
        .iter()
        .map(|(k, e)| (*k, e.clone()))
        .collect();
    let mut summary = TaskSummary {
        tasks: tasks.len(),
        ..TaskSummary::default()
    };
    let mut body = String::new();
    for (_, e) in &tasks {
        let _ = writeln!(body);
        write_task(&mut body, e, &mut summary);
    }
    let mut text = String::new();
    text.push_str("------------[ selftrace: tasks ]------------\n");
    let _ = write!(
        text,
        "{} tasks: {} idle, {} running, {} not polled yet",
        summary.tasks,
        summary.idle + summary.no_chain,
        summary.running,
        summary.not_started
    );
    if summary.finished > 0 {
        let _ = write!(text, ", {} finished while read", summary.finished);
    }
    text.push('\n');
    text.push_str(&body);
    text.push_str("---[ end of tasks ]---\n");
    out.write_all(text.as_bytes())?;
    Ok(summary)
}

/// Deepest chain listed per task.
const MAX_CHAIN: usize = 64;

fn write_task(out: &mut String, e: &Entry, summary: &mut TaskSummary) {
    let _ = write!(out, "task");
    if let Some(id) = e.task_id.load(Ordering::Relaxed).checked_sub(1) {
        let _ = write!(out, " {id}");
    }
    let at = e.spawned_at;
    let _ = write!(
        out,
        " spawned at {}:{}:{}",
        at.file(),
        at.line(),
        at.column()
    );
    let before = e.polls.load(Ordering::Acquire);
    if before == 0 {
        summary.not_started += 1;
        let _ = writeln!(out, ", not polled yet");
        return;
    }
    if before % 2 == 1 {
        running(out, e, summary);
        return;
    }
    let chain = await_chain(e.poll, e.root.load(Ordering::Relaxed), MAX_CHAIN);
    core::sync::atomic::fence(Ordering::SeqCst);
    if e.gone.load(Ordering::SeqCst) {
        summary.finished += 1;
        let _ = writeln!(out, ", finished while it was read");
        return;
    }
    // Polled meanwhile: what was read may be half of one state and half of another.
    if e.polls.load(Ordering::Acquire) != before {
        running(out, e, summary);
        return;
    }
    let _ = writeln!(out, ", idle (polled {} times)", before / 2);
    match chain {
        Ok(chain) => {
            summary.idle += 1;
            for a in &chain {
                write_awaiting(out, a);
            }
        }
        Err(why) => {
            summary.no_chain += 1;
            let _ = writeln!(out, " no chain of awaits: {why}");
        }
    }
}

/// ` #N name state at file:line`: N is the depth (0: the task's future), so the branches of a
/// `join!` or `select!` each start again at the depth below it.
fn write_awaiting(out: &mut String, a: &Awaiting) {
    let _ = write!(out, " #{} {}", a.depth, a.name);
    if !a.state.is_empty() {
        let _ = write!(out, " {}", a.state);
    }
    if let Some((file, line)) = &a.at {
        let _ = write!(out, " at {file}:{line}");
    }
    if let Some((file, line)) = &a.in_fn_at {
        let _ = write!(out, " (a macro's .await, in the async fn at {file}:{line})");
    }
    out.push('\n');
}

/// A task being polled: its worker's line and stack, as thread dumps and watchdog reports
/// write them (addresses, names, file:line, the objects).
fn running(out: &mut String, e: &Entry, summary: &mut TaskSummary) {
    summary.running += 1;
    let tid = e.tid.load(Ordering::Relaxed);
    let _ = writeln!(out, ", running on thread tid {tid}");
    let info = crate::threads::info(tid);
    let mut frames = vec![0usize; 256];
    let walk = crate::threads::capture(tid, &mut frames, std::time::Duration::from_secs(1));
    let stack = walk.map(|w| (&frames[..w.frames], w.end, w.frame_kinds()));
    let text = crate::threads::through_anonymous_file(|fd| {
        crate::threads::write_thread(fd, tid, info.as_ref(), stack)
    });
    match text {
        Ok(((), t)) => out.push_str(&String::from_utf8_lossy(&t)),
        Err(e) => {
            let _ = writeln!(out, " no stack (no anonymous file to write it in: {e})");
        }
    }
}

/// After each all-thread dump of the dump signal ([`crate::threads::install_dump_signal`]),
/// writes the task dump to the same fd, from a thread of its own (named `task-dump`; the dump
/// reads DWARF, which a signal handler cannot). Normal context; once per process (later calls
/// do nothing).
///
/// # Errors
/// [`crate::Error::Sys`] when the pipe or the thread cannot be made.
pub fn dump_on_signal() -> Result<(), crate::error::Error> {
    static STARTED: std::sync::Mutex<bool> = std::sync::Mutex::new(false);
    let mut started = STARTED.lock().unwrap_or_else(|e| e.into_inner());
    if *started {
        return Ok(());
    }
    let [read, write] = crate::sys::pipe_cloexec()?;
    let spawned = std::thread::Builder::new()
        .name("task-dump".into())
        .spawn(move || {
            let mut byte = [0u8; 1];
            while matches!(crate::sys::read(read, &mut byte), Ok(1)) {
                let _ = dump_to(FdWriter(crate::threads::dump_signal_fd()));
            }
        });
    match spawned {
        Ok(_) => {
            crate::threads::AFTER_DUMP.store(write, Ordering::Relaxed);
            *started = true;
            Ok(())
        }
        Err(e) => {
            crate::sys::close(read);
            crate::sys::close(write);
            Err(crate::error::Error::from_io("pthread_create", &e))
        }
    }
}

/// Writes to a raw fd that someone else keeps open.
struct FdWriter(i32);

impl std::io::Write for FdWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        crate::sys::write_all(self.0, buf)
            .map(|()| buf.len())
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno().unwrap_or(libc::EIO)))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
