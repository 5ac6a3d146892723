//! One thread of a dump: its register context (from the fault, from its own registers, from a
//! crashed thread waiting on the output lock, or asked from the thread through the stack-request
//! handshake of `threads::request`) and the copy of its stack that matches it.

#[cfg(feature = "threads")]
use super::file::Loc;
use super::file::{File, MAX_OFFSET, TAIL_RESERVE};
use super::{Options, State, ThreadRec};
use crate::context as arch;

/// What the writer got for one thread.
#[cfg_attr(not(feature = "threads"), allow(dead_code))]
pub(super) enum Got {
    /// Its context is in `State::context`; its stack is to be copied now.
    Here,
    /// [`thread_context`] wrote its context and (unless `stack` is false: left out) its stack.
    Done { stack: bool },
    /// It did not answer (or cannot): listed without context.
    Nothing,
    /// It does not exist any more.
    Gone,
}

/// Asks thread `tid` for its context, holding it in its handler while its stack is copied.
pub(super) fn thread_context(
    tid: i32,
    timeout_ns: u64,
    st: &mut State,
    f: &mut File,
    rec: &mut ThreadRec,
    opts: &Options,
) -> Got {
    #[cfg(feature = "threads")]
    {
        use crate::threads::request::{release_context, request_context, ContextAnswer};
        match request_context(tid, timeout_ns, &mut st.context) {
            ContextAnswer::Context(ticket) => {
                rec.context = f.append(&st.context);
                let mut stack = copy_stack(st, f, rec, opts);
                if !release_context(ticket) {
                    // It stopped waiting before the copy ended: the copy is not its stack at
                    // the time of its registers.
                    rec.stack = Loc::default();
                    rec.stack_start = 0;
                    stack = false;
                }
                Got::Done { stack }
            }
            ContextAnswer::Timeout => Got::Nothing,
            ContextAnswer::Gone => Got::Gone,
        }
    }
    #[cfg(not(feature = "threads"))]
    {
        let _ = (tid, timeout_ns, st, f, rec, opts);
        Got::Nothing
    }
}

/// Whether thread `tid` cannot answer a context request now: stopped (`T`, `t`), or with the
/// request signal blocked or ignored (the check the text dumps use too,
/// `procfs::cannot_answer`), so that asking would only wait for the timeout.
pub(super) fn cannot_answer(tid: i32) -> bool {
    #[cfg(feature = "threads")]
    {
        crate::threads::request::cannot_answer(tid).is_some()
    }
    #[cfg(not(feature = "threads"))]
    {
        // Nobody would answer without the stack-request handler.
        let _ = tid;
        true
    }
}

/// Copies the stack of the thread whose context is in `st.context` into the dump: from its
/// stack pointer (less the red zone) up to [`Options::stack_size`] bytes, and no further than
/// the end of the stack's mapping. False when it was left out (the dump's size limit).
pub(super) fn copy_stack(
    st: &mut State,
    f: &mut File,
    rec: &mut ThreadRec,
    opts: &Options,
) -> bool {
    let Some((sp, _)) = arch::sp_pc(&st.context) else {
        return true;
    };
    let sp = sp as usize;
    let mut from = sp.saturating_sub(arch::RED_ZONE);
    let mut limit = opts.stack_size;
    if let Some((start, end)) = stack_mapping(&st.maps[..st.map_count], sp) {
        from = from.max(start);
        limit = end.saturating_sub(from).min(opts.stack_size);
    }
    if f.next() + limit as u64 + TAIL_RESERVE > MAX_OFFSET {
        return false;
    }
    if let Some((start, loc)) = f.append_memory(from, limit, &mut st.chunk) {
        rec.stack_start = start;
        rec.stack = loc;
    }
    true
}

/// The readable mapping that holds the stack at `sp`: the mapping containing `sp`, or, when
/// `sp` lies in a guard page or gap below the stack (an overflow), the readable mapping that
/// begins at most 1 MiB above it. `None` when the table does not say.
fn stack_mapping(maps: &[(usize, usize, bool)], sp: usize) -> Option<(usize, usize)> {
    let i = maps.partition_point(|m| m.1 <= sp);
    let (start, end, readable) = *maps.get(i)?;
    if start <= sp && readable {
        return Some((start, end));
    }
    // In an unreadable mapping or in a gap: the next readable one above.
    maps[i..]
        .iter()
        .find(|m| m.2 && m.0 > sp)
        .filter(|m| m.0 - sp <= 1 << 20)
        .map(|m| (m.0, m.1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stack_mappings() {
        let maps = [
            (0x1000, 0x2000, true),
            (0x2000, 0x3000, false), // a guard page
            (0x3000, 0x9000, true),  // a stack
            (0x9000, 0xa000, true),  // what follows it
        ];
        assert_eq!(stack_mapping(&maps, 0x4000), Some((0x3000, 0x9000)));
        assert_eq!(
            stack_mapping(&maps, 0x2800),
            Some((0x3000, 0x9000)),
            "overflow into the guard"
        );
        assert_eq!(stack_mapping(&maps, 0x9fff), Some((0x9000, 0xa000)));
        assert_eq!(stack_mapping(&maps, 0xa000), None);
    }
}
