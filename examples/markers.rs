//! Trace markers end to end: writes sections (nested, on two threads), async sections, a named
//! track and counters; reads them back from a private tracefs instance; prints them; and saves
//! the instance's trace as a file Perfetto opens.
//!
//! ```sh
//! sudo cargo run --example markers [OUTPUT.trace]
//! ```
//!
//! Then open <https://ui.perfetto.dev>, "Open trace file", and pick the file: the sections are
//! slices on each thread's track, the async sections and the named track are tracks of the
//! process, the counters are counter tracks.

use selftrace::trace;
use selftrace::tracefs::Instance;

fn main() {
    let status = trace::init();
    println!("trace markers: {status}");
    if status != trace::Status::Enabled {
        println!("(run as root on a kernel with tracefs to see markers)");
        return;
    }
    // A private instance that records this program's markers (copy_trace_marker on 6.17+,
    // else the top-level buffer is read without consuming it). Removed when dropped.
    let inst = match Instance::for_markers("selftrace-demo") {
        Ok(i) => i,
        Err(e) => {
            println!("cannot create a tracefs instance: {e}");
            return;
        }
    };
    // Kernel events next to the markers: the scheduler's context switches.
    if let Err(e) = inst.set_event_enabled("sched", "sched_switch", true) {
        println!("(no sched_switch events: {e})");
    }
    println!(
        "instance {} (copy_trace_marker: {})",
        inst.name(),
        inst.copies_markers()
    );

    let work = |who: &str| {
        for frame in 0..3 {
            let _f = trace::section!("{who} frame {frame}");
            {
                let _d = trace::section("decode");
                trace::set_counter(&format!("{who} queue"), 3 - frame);
            }
            trace::instant(&format!("{who} vsync"));
        }
    };
    trace::begin_async_section("load assets", 1);
    trace::begin_async_section_for_track("network", "GET /index.html", 7);
    std::thread::scope(|s| {
        s.spawn(|| work("worker"));
        work("main");
    });
    trace::end_async_section_for_track("network", 7);
    trace::instant_for_track("network", "connection closed");
    trace::end_async_section("load assets", 1);

    let pid = std::process::id();
    println!("\nread back (this process only):");
    println!(
        "{:>16}  {:>7}  {:<12}  text",
        "timestamp (ns)", "tid", "kind"
    );
    let events = inst.read_markers().expect("read markers");
    for e in events.iter().filter(|e| e.pid == Some(pid)) {
        println!(
            "{:>16}  {:>7}  {:<12}  {}",
            e.timestamp_ns,
            e.tid,
            format!("{:?}", e.kind),
            e.text
        );
    }

    let out = std::env::args().nth(1).unwrap_or_else(|| {
        let dir = if std::path::Path::new("target").is_dir() {
            std::path::PathBuf::from("target")
        } else {
            std::env::temp_dir()
        };
        dir.join("selftrace-markers.trace")
            .to_string_lossy()
            .into_owned()
    });
    let text = inst.read_trace().expect("read trace");
    std::fs::write(&out, text).expect("write trace file");
    println!("\nwrote {out}: open https://ui.perfetto.dev, \"Open trace file\", pick it.");
}
