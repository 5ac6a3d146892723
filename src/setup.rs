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
    symbolize::set_up()
}

/// Picks up objects loaded or unloaded since the last snapshot (`dlopen`, `dlclose`): publishes
/// a new unwinder and symbol index. Captures running meanwhile in other threads or signal
/// handlers keep using the old ones until they finish. Not async-signal-safe.
pub fn refresh() {
    modules::refresh(false);
    unwind::rebuild();
    symbolize::rebuild();
}

pub use crate::symbolize::prepare;
