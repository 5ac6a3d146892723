//! DWARF CFI from `.eh_frame`: derives a frame's rule with gimli (on-stack storage, no
//! allocation), compiles it when it fits [`Rule`], and otherwise evaluates every rule of the
//! row in full: CFA from any register or a DWARF expression, and `offset`, `val_offset`,
//! `register`, `expression`, `val_expression`, `same_value` and `undefined` register rules.
//!
//! Expression evaluation is bounded ([`MAX_OPS`] operations, a [`EVAL_STACK`]-deep stack), reads
//! memory only through the walk's [`CheckedMemory`], and fails (the walk stops and says so)
//! on anything it cannot evaluate.

use super::arch::{self, COUNT, PC, RA, SP};
use super::memory::CheckedMemory;
use super::regs::RegSet;
use super::rule::{Kind, Rule, SAME, UNDEF};
use super::tables::UnwindData;
use super::types::StopReason;
use gimli::{
    BaseAddresses, CfaRule, EhFrame, EhFrameHdr, EndianSlice, Evaluation, EvaluationResult,
    EvaluationStorage, LittleEndian, Location, Piece, Register, RegisterRule, UnwindContext,
    UnwindContextStorage, UnwindExpression, UnwindSection, UnwindTableRow, Value,
};

type R<'a> = EndianSlice<'a, LittleEndian>;

/// Bytes of an address.
const ADDRESS_SIZE: u8 = core::mem::size_of::<usize>() as u8;

/// Most register rules one row may hold (x86-64 has 17 general registers, aarch64 33, plus the
/// vector ones some assembly describes).
const MAX_RULES: usize = 48;
/// Most nested `DW_CFA_remember_state`s.
const MAX_REMEMBER: usize = 4;
/// Most operations one expression may execute.
pub(crate) const MAX_OPS: u32 = 256;
/// Deepest expression stack.
pub(crate) const EVAL_STACK: usize = 32;

/// gimli's unwind-context storage in fixed arrays: no allocation while a row is computed.
pub(crate) struct CtxStore;

impl UnwindContextStorage<usize> for CtxStore {
    type Rules = [(Register, RegisterRule<usize>); MAX_RULES];
    type Stack = [UnwindTableRow<usize, Self>; MAX_REMEMBER];
}

/// The scratch state gimli needs to run a CFI program (about 10 KiB; one per walk slot).
pub(crate) type Ctx = UnwindContext<usize, CtxStore>;

/// A new context. Normal context (the caller boxes it).
pub(crate) fn new_ctx() -> Box<Ctx> {
    Box::new(UnwindContext::new_in())
}

/// gimli's expression-evaluator storage in fixed arrays.
struct EvalStore;

impl<'a> EvaluationStorage<R<'a>> for EvalStore {
    type Stack = [Value; EVAL_STACK];
    type ExpressionStack = [(R<'a>, R<'a>); 4];
    type Result = [Piece<R<'a>>; 1];
}

/// What the CFI says of a lookup address.
pub(crate) enum Found {
    /// The rule, compiled ([`Kind::Cfi`], [`Kind::End`]) or needing the full evaluator
    /// ([`Kind::Slow`]).
    Rule(Rule),
    /// No FDE covers the address.
    NoCfi,
    /// The tables are malformed or use something gimli does not support.
    Bad,
}

impl UnwindData {
    fn bases(&self) -> BaseAddresses {
        BaseAddresses::default()
            .set_eh_frame_hdr(self.hdr_addr as u64)
            .set_eh_frame(self.eh_frame_addr as u64)
            .set_text(self.text_addr as u64)
    }

    fn eh_frame(&self) -> EhFrame<R<'_>> {
        let mut f = EhFrame::new(&self.eh_frame, LittleEndian);
        f.set_address_size(ADDRESS_SIZE);
        f.set_vendor(arch::VENDOR);
        f
    }

    /// The FDE that covers `lookup`, found through `.eh_frame_hdr`'s table.
    fn fde(&self, lookup: usize) -> Result<gimli::FrameDescriptionEntry<R<'_>>, Found> {
        let bases = self.bases();
        let hdr = EhFrameHdr::new(&self.hdr, LittleEndian)
            .parse(&bases, ADDRESS_SIZE)
            .map_err(|_| Found::Bad)?;
        let Some(table) = hdr.table() else {
            return Err(Found::NoCfi);
        };
        let eh_frame = self.eh_frame();
        match table.fde_for_address(&eh_frame, &bases, lookup as u64, EhFrame::cie_from_offset) {
            Ok(fde) => Ok(fde),
            Err(gimli::Error::NoUnwindInfoForAddress) => Err(Found::NoCfi),
            Err(_) => Err(Found::Bad),
        }
    }

    /// Runs `f` on the row of `lookup` and the section it came from.
    fn with_row<T>(
        &self,
        ctx: &mut Ctx,
        lookup: usize,
        f: impl FnOnce(&UnwindTableRow<usize, CtxStore>, &EhFrame<R<'_>>, gimli::Encoding) -> T,
    ) -> Result<T, Found> {
        let fde = self.fde(lookup)?;
        let eh_frame = self.eh_frame();
        match fde.unwind_info_for_address(&eh_frame, &self.bases(), ctx, lookup as u64) {
            Ok(row) => Ok(f(row, &eh_frame, fde.cie().encoding())),
            Err(gimli::Error::NoUnwindInfoForAddress) => Err(Found::NoCfi),
            Err(_) => Err(Found::Bad),
        }
    }

    /// Whether an FDE covers `addr`.
    ///
    /// # Async-signal safety
    /// Async-signal-safe.
    pub(crate) fn covers(&self, addr: usize) -> bool {
        self.fde(addr).is_ok()
    }

    /// The rule for `lookup` (a pc, or a return address minus one), and when the rule needs the
    /// full evaluator, that evaluation too
    /// (on `regs`), from the same pass over the CFI: a miss in code whose rules are expressions
    /// (OpenSSL's assembly, sampled at ever new pcs) derives the row once, not twice.
    ///
    /// # Async-signal safety
    /// Async-signal-safe.
    pub(crate) fn find_and_eval(
        &self,
        ctx: &mut Ctx,
        lookup: usize,
        regs: &mut RegSet,
        mem: &mut CheckedMemory<'_>,
    ) -> (Found, Option<Result<bool, StopReason>>) {
        match self.with_row(ctx, lookup, |row, section, encoding| {
            let rule = compile(row);
            let eval =
                (rule.kind == Kind::Slow).then(|| eval_row(row, section, encoding, regs, mem));
            (rule, eval)
        }) {
            Ok((rule, eval)) => (Found::Rule(rule), eval),
            Err(f) => (f, None),
        }
    }

    /// Unwinds one frame with the full evaluator: `regs` becomes the caller's registers.
    /// Returns `Ok(false)` when the return address is undefined (the outermost frame).
    ///
    /// # Async-signal safety
    /// Async-signal-safe.
    pub(crate) fn step_full(
        &self,
        ctx: &mut Ctx,
        lookup: usize,
        regs: &mut RegSet,
        mem: &mut CheckedMemory<'_>,
    ) -> Result<bool, StopReason> {
        match self.with_row(ctx, lookup, |row, section, encoding| {
            eval_row(row, section, encoding, regs, mem)
        }) {
            Ok(r) => r,
            Err(_) => Err(StopReason::NoUnwindRule),
        }
    }
}

/// Compiles a row into a [`Rule`]: [`Kind::Cfi`] when every rule fits the compiled form,
/// [`Kind::End`] when the return address is undefined, else [`Kind::Slow`].
fn compile(row: &UnwindTableRow<usize, CtxStore>) -> Rule {
    let slow = Rule::of(Kind::Slow);
    let mut rule = Rule::of(Kind::Cfi);
    match *row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            let base = register.0;
            let (Ok(off), true) = (i32::try_from(offset), arch::is_gpr(base) || base == SP) else {
                return slow;
            };
            rule.cfa_reg = register.0 as u8;
            rule.cfa_off = off;
        }
        CfaRule::Expression(_) => return slow,
    }
    let mut ra = None;
    for (reg, r) in row.registers() {
        let n = reg.0;
        if n == RA {
            match r {
                RegisterRule::Undefined => return Rule::of(Kind::End),
                RegisterRule::Offset(o) => match i16::try_from(*o) {
                    Ok(o) if o != SAME && o != UNDEF => ra = Some(o),
                    _ => return slow,
                },
                _ => return slow,
            }
        } else if let Some(i) = arch::SAVED.iter().position(|&s| s == n) {
            rule.saved[i] = match r {
                RegisterRule::SameValue => SAME,
                RegisterRule::Undefined => UNDEF,
                RegisterRule::Offset(o) => match i16::try_from(*o) {
                    Ok(o) if o != SAME && o != UNDEF => o,
                    _ => return slow,
                },
                _ => return slow,
            };
        } else if arch::is_gpr(n) || n == SP {
            // The stack pointer, or a caller-saved register: only "nothing to restore" compiles.
            if !matches!(r, RegisterRule::Undefined | RegisterRule::SameValue) || n == SP {
                return slow;
            }
        }
        // Vector and other registers do not matter to a stack walk.
    }
    match ra {
        Some(o) => {
            rule.ra_off = o;
            if rule.packable() {
                rule
            } else {
                slow
            }
        }
        // No rule for the return-address column: the link register is unchanged (aarch64; the
        // full evaluator takes it where it is known), or the outermost frame (x86-64).
        None if arch::RA_UNSPECIFIED_IS_SAME => slow,
        None => Rule::of(Kind::End),
    }
}

/// Applies a row in full; see [`UnwindData::step_full`].
fn eval_row(
    row: &UnwindTableRow<usize, CtxStore>,
    section: &EhFrame<R<'_>>,
    encoding: gimli::Encoding,
    regs: &mut RegSet,
    mem: &mut CheckedMemory<'_>,
) -> Result<bool, StopReason> {
    let cfa = match *row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => regs
            .get(register.0)
            .ok_or(StopReason::RegisterUnknown)?
            .wrapping_add(offset as usize),
        CfaRule::Expression(e) => eval_expr(section, e, encoding, None, regs, mem)?,
    };
    let old = *regs;
    // A register without a rule keeps its value ("same value"), as libgcc, libunwind and gdb
    // read DWARF CFI: hand-written assembly (OpenSSL's AES-GCM) bases its CFA on rax across a
    // call to a routine that leaves rax alone.
    let mut new = old;
    let mut ra = None;
    for (reg, rule) in row.registers() {
        let n = reg.0;
        // Only registers the set tracks (not the pc's own slot where the pc is not a DWARF
        // register, nor pseudo-registers such as aarch64's RA_SIGN_STATE).
        if n as usize >= COUNT || (n == PC && PC != RA) {
            continue;
        }
        let value = match rule {
            RegisterRule::Undefined => None,
            RegisterRule::SameValue => old.get(n),
            RegisterRule::Offset(o) => Some(
                mem.read_word(cfa.wrapping_add(*o as usize))
                    .ok_or(StopReason::UnreadableMemory)?,
            ),
            RegisterRule::ValOffset(o) => Some(cfa.wrapping_add(*o as usize)),
            RegisterRule::Register(r) => old.get(r.0),
            RegisterRule::Expression(e) => {
                let at = eval_expr(section, *e, encoding, Some(cfa), &old, mem)?;
                Some(mem.read_word(at).ok_or(StopReason::UnreadableMemory)?)
            }
            RegisterRule::ValExpression(e) => {
                Some(eval_expr(section, *e, encoding, Some(cfa), &old, mem)?)
            }
            RegisterRule::Constant(c) => Some(*c as usize),
            RegisterRule::Architectural => None,
        };
        if n == RA {
            match value {
                Some(v) => ra = Some(v),
                None if matches!(rule, RegisterRule::Undefined) => return Ok(false),
                None => return Err(StopReason::RegisterUnknown),
            }
        } else {
            match value {
                Some(v) => new.set(n, v),
                None => new.forget(n),
            }
        }
    }
    let ra = match ra {
        Some(ra) => ra,
        // No rule: the link register holds it (aarch64), if this frame knows it.
        None if arch::RA_UNSPECIFIED_IS_SAME => old.get(RA).ok_or(StopReason::RegisterUnknown)?,
        // No rule: the outermost frame (x86-64).
        None => return Ok(false),
    };
    // The caller's stack pointer is the CFA unless a rule restored it explicitly.
    if !row.registers().any(|(r, _)| r.0 == SP) {
        new.set(SP, cfa);
    }
    new.set_return(arch::strip_ra(ra));
    *regs = new;
    Ok(true)
}

/// Evaluates a CFI expression; `push` is the value pushed first (the CFA, for register rules).
fn eval_expr(
    section: &EhFrame<R<'_>>,
    expr: UnwindExpression<usize>,
    encoding: gimli::Encoding,
    push: Option<usize>,
    regs: &RegSet,
    mem: &mut CheckedMemory<'_>,
) -> Result<usize, StopReason> {
    let bad = |_| StopReason::NoUnwindRule;
    let expr = expr.get(section).map_err(bad)?;
    let mut eval = Evaluation::<R<'_>, EvalStore>::new_in(expr.0, encoding);
    eval.set_max_iterations(MAX_OPS);
    if let Some(v) = push {
        eval.set_initial_value(v as u64);
    }
    let mut state = eval.evaluate().map_err(bad)?;
    loop {
        state = match state {
            EvaluationResult::Complete => break,
            EvaluationResult::RequiresMemory { address, size, .. } => {
                let v = mem
                    .read_sized(address as usize, size as usize)
                    .ok_or(StopReason::UnreadableMemory)?;
                eval.resume_with_memory(Value::Generic(v as u64))
                    .map_err(bad)?
            }
            EvaluationResult::RequiresRegister { register, .. } => {
                let v = regs.get(register.0).ok_or(StopReason::RegisterUnknown)?;
                eval.resume_with_register(Value::Generic(v as u64))
                    .map_err(bad)?
            }
            _ => return Err(StopReason::NoUnwindRule),
        };
    }
    match eval.as_result() {
        [Piece {
            location: Location::Address { address },
            ..
        }] => Ok(*address as usize),
        [Piece {
            location: Location::Value { value },
            ..
        }] => value
            .to_u64(!0)
            .map(|v| v as usize)
            .map_err(|_| StopReason::NoUnwindRule),
        _ => Err(StopReason::NoUnwindRule),
    }
}
