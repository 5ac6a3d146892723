//! Setting the process up: [`init`] snapshots the loaded objects and builds the unwinder and the
//! symbol index over them, [`refresh`] follows `dlopen`/`dlclose`, and [`prepare`] also waits
//! for the symbol tables that the background indexer builds. These sit above `unwind` and
//! `symbolize`, which never call back up here.

use crate::error::Error;
use crate::{modules, symbolize, unwind};

/// Snapshots the loaded objects, builds the DWARF unwinder and the symbol index, and learns the
/// calling thread's stack bounds. Idempotent: a second call only does work when objects were
/// loaded or unloaded since. Not async-signal-safe: call it early, outside signal handlers
/// (capture works before it too, with frame pointers only).
///
/// The symbol tables of objects that map 64 MiB or more (rustc's `librustc_driver`, a browser's
/// main library) are built by a background thread instead, so that `init` does not take a
/// tenth of a second per such object; until one is built, lookups there give no name
/// ([`symbolize::SymbolSource::Pending`]) and the normal-context functions that need names wait
/// for it. [`symbolize::set_background_index`] changes the size or turns this off;
/// [`prepare`] waits for every object.
///
/// # Errors
/// [`Error::NoUnwindInfo`] when no loaded object has `.eh_frame_hdr` (captures then use frame
/// pointers).
pub fn init() -> Result<(), Error> {
    // (Registered before main by a constructor; again here in case that was not linked in.)
    crate::fork::register();
    modules::refresh(false);
    unwind::prepare();
    symbolize::rebuild();
    let ok = modules::with_current(|s| {
        s.is_some_and(|s| s.objects().iter().any(|o| o.eh_frame_hdr.is_some()))
    });
    if ok {
        Ok(())
    } else {
        Err(Error::NoUnwindInfo)
    }
}

/// Picks up objects loaded or unloaded since the last snapshot (`dlopen`, `dlclose`): publishes
/// a new unwinder and symbol index. Captures running meanwhile in other threads or signal
/// handlers keep using the old ones until they finish. Not async-signal-safe.
pub fn refresh() {
    modules::refresh(false);
    unwind::rebuild();
    symbolize::rebuild();
}

/// Makes sure the symbol index covers the objects loaded now, with every name: does what
/// [`init`] does (a refresh when objects were loaded or unloaded since), then waits for the
/// objects that the background indexer has not finished
/// ([`symbolize::set_background_index`]).
///
/// Not async-signal-safe. [`init`] and [`refresh`] do the same without the wait; call one of
/// them (or this) before using [`symbolize()`](crate::symbolize()) in a signal handler, and
/// again after `dlopen`.
///
/// Also at its old path, `selftrace::symbolize::prepare`.
///
/// # Errors
/// [`Error::NoUnwindInfo`] as [`init`].
pub fn prepare() -> Result<(), Error> {
    init()?;
    symbolize::rebuild();
    symbolize::wait_indexed(None);
    Ok(())
}
