//! Atomic operations (`FI_ATOMIC`): which (operation, datatype) pairs the
//! provider carries out, how one is described on the wire, and how it is
//! applied to the target's memory.
//!
//! Where atomics run. MetaRoCE's transport has 8-byte remote atomics
//! (fetch-add, compare-swap), but they address MetaRoCE's own memory
//! regions, which own their bytes: an application's `fi_mr_reg` memory is
//! not one of them (the same reason RMA is carried out by the target's
//! provider, see `endpoint`). So every atomic is a request that the
//! target's provider executes on the registered region, after checking
//! the key, the access rights and the bounds, and answers with the
//! original values. That makes every datatype and operation below as
//! cheap as the 8-byte ones, so the provider offers all that it can
//! compute exactly, and refuses the rest (`FI_LONG_DOUBLE` and
//! `FI_LONG_DOUBLE_COMPLEX`: their layout is the compiler's, and Rust has
//! no such type to compute with).
//!
//! Atomicity. The target executes each request under one process-wide
//! lock ([`TARGET_LOCK`]), reading the target elements, computing, and
//! writing them back before the next request runs. Atomics through this
//! provider are thus atomic with respect to each other, from every peer
//! and every domain of the process, per element and in fact per request.
//! As the libfabric specification says of atomics from different actors,
//! they are not atomic with respect to the CPU's own loads, stores and
//! atomics on the same memory at the same time.
//!
//! Byte order. Operands travel in host byte order, as the application
//! gave them: both ends are assumed to share one (every platform the
//! provider builds on is little-endian).
//!
//! The operations are those of `fi_atomic(3)`: for target element `t`,
//! operand `o` and compare value `c`, FI_MIN `t = min(t, o)` (`o < t`
//! replaces), FI_MAX, FI_SUM `t + o`, FI_PROD `t * o` (integers wrap),
//! FI_LOR / FI_LAND / FI_LXOR as C's `||`, `&&` and their exclusive form
//! (the result is 1 or 0), FI_BOR / FI_BAND / FI_BXOR bitwise,
//! FI_ATOMIC_READ (fetch only), FI_ATOMIC_WRITE `t = o`, FI_CSWAP
//! `c == t`, FI_CSWAP_NE `c != t`, FI_CSWAP_LE `c <= t`, FI_CSWAP_LT
//! `c < t`, FI_CSWAP_GE `c >= t`, FI_CSWAP_GT `c > t` (each: then `t = o`)
//! and FI_MSWAP `t = (o & c) | (t & !c)`. Floating-point comparisons are
//! IEEE 754's (a NaN compares false), as in C.

use crate::ffi::sys;
use std::sync::Mutex;

/// Serializes every atomic this process's provider executes on target
/// memory (see the module docs).
pub(crate) static TARGET_LOCK: Mutex<()> = Mutex::new(());

/// An atomic's element type (`enum fi_datatype`), as far as the provider
/// computes with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Datatype {
    /// `FI_INT8`.
    I8,
    /// `FI_UINT8`.
    U8,
    /// `FI_INT16`.
    I16,
    /// `FI_UINT16`.
    U16,
    /// `FI_INT32`.
    I32,
    /// `FI_UINT32`.
    U32,
    /// `FI_INT64`.
    I64,
    /// `FI_UINT64`.
    U64,
    /// `FI_INT128`.
    I128,
    /// `FI_UINT128`.
    U128,
    /// `FI_FLOAT`.
    F32,
    /// `FI_DOUBLE`.
    F64,
    /// `FI_FLOAT_COMPLEX`: (real, imaginary) `float`s.
    ComplexF32,
    /// `FI_DOUBLE_COMPLEX`: (real, imaginary) `double`s.
    ComplexF64,
}

/// Every datatype the provider computes with.
pub const DATATYPES: [Datatype; 14] = [
    Datatype::I8,
    Datatype::U8,
    Datatype::I16,
    Datatype::U16,
    Datatype::I32,
    Datatype::U32,
    Datatype::I64,
    Datatype::U64,
    Datatype::I128,
    Datatype::U128,
    Datatype::F32,
    Datatype::F64,
    Datatype::ComplexF32,
    Datatype::ComplexF64,
];

/// An atomic operation (`enum fi_op`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `FI_MIN`.
    Min,
    /// `FI_MAX`.
    Max,
    /// `FI_SUM`.
    Sum,
    /// `FI_PROD`.
    Prod,
    /// `FI_LOR`.
    Lor,
    /// `FI_LAND`.
    Land,
    /// `FI_BOR`.
    Bor,
    /// `FI_BAND`.
    Band,
    /// `FI_LXOR`.
    Lxor,
    /// `FI_BXOR`.
    Bxor,
    /// `FI_ATOMIC_READ`.
    Read,
    /// `FI_ATOMIC_WRITE`.
    Write,
    /// `FI_CSWAP`.
    Cswap,
    /// `FI_CSWAP_NE`.
    CswapNe,
    /// `FI_CSWAP_LE`.
    CswapLe,
    /// `FI_CSWAP_LT`.
    CswapLt,
    /// `FI_CSWAP_GE`.
    CswapGe,
    /// `FI_CSWAP_GT`.
    CswapGt,
    /// `FI_MSWAP`.
    Mswap,
}

/// Every operation.
pub const OPS: [Op; 19] = [
    Op::Min,
    Op::Max,
    Op::Sum,
    Op::Prod,
    Op::Lor,
    Op::Land,
    Op::Bor,
    Op::Band,
    Op::Lxor,
    Op::Bxor,
    Op::Read,
    Op::Write,
    Op::Cswap,
    Op::CswapNe,
    Op::CswapLe,
    Op::CswapLt,
    Op::CswapGe,
    Op::CswapGt,
    Op::Mswap,
];

/// Which family of calls an atomic comes through: each family allows its
/// own operations (`fi_atomic(3)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Call {
    /// `fi_atomic*` / `fi_inject_atomic`: the result stays at the target.
    Base,
    /// `fi_fetch_atomic*`: the original values come back.
    Fetch,
    /// `fi_compare_atomic*`: with compare values; the originals come back.
    Compare,
}

/// Why an atomic is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AtomicError {
    /// A datatype value the provider does not compute with.
    #[error("datatype {} is not supported for atomics (see docs/libfabric.md)", datatype_name(*.0))]
    Datatype(u32),
    /// An operation value outside `enum fi_op`'s atomics.
    #[error("operation {0} is not an atomic operation")]
    UnknownOp(u32),
    /// The operation does not belong to this family of calls.
    #[error("{op} is not a {call} atomic operation")]
    WrongCall {
        /// The operation.
        op: &'static str,
        /// The family.
        call: &'static str,
    },
    /// The operation is not defined on the datatype.
    #[error("{op} is not defined on {datatype}")]
    WrongDatatype {
        /// The operation.
        op: &'static str,
        /// The datatype.
        datatype: &'static str,
    },
    /// Zero elements.
    #[error("an atomic needs at least one element")]
    NoElements,
    /// More elements than one request carries.
    #[error("{count} elements exceed the {max} one atomic carries")]
    TooMany {
        /// Asked for.
        count: usize,
        /// At most.
        max: usize,
    },
    /// A request field that does not decode.
    #[error("malformed atomic request: {0}")]
    Malformed(&'static str),
}

impl AtomicError {
    /// The positive `FI_E*` code a call returns for this refusal.
    pub fn fi_errno(&self) -> i32 {
        match self {
            Self::Datatype(_)
            | Self::UnknownOp(_)
            | Self::WrongCall { .. }
            | Self::WrongDatatype { .. } => sys::FI_EOPNOTSUPP as i32,
            Self::TooMany { .. } => sys::FI_EMSGSIZE as i32,
            Self::NoElements | Self::Malformed(_) => sys::FI_EINVAL as i32,
        }
    }
}

/// A libfabric datatype value's name, for messages (including the ones
/// the provider refuses).
fn datatype_name(v: u32) -> String {
    match Datatype::from_fi(v) {
        Ok(d) => d.name().to_string(),
        Err(_) if v == sys::fi_datatype_FI_LONG_DOUBLE => "FI_LONG_DOUBLE".into(),
        Err(_) if v == sys::fi_datatype_FI_LONG_DOUBLE_COMPLEX => "FI_LONG_DOUBLE_COMPLEX".into(),
        Err(_) => format!("{v}"),
    }
}

/// What kind of values a datatype holds, which decides its operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Integer,
    Real,
    Complex,
}

impl Datatype {
    /// From `enum fi_datatype`.
    pub fn from_fi(v: u32) -> Result<Self, AtomicError> {
        Ok(match v {
            sys::fi_datatype_FI_INT8 => Self::I8,
            sys::fi_datatype_FI_UINT8 => Self::U8,
            sys::fi_datatype_FI_INT16 => Self::I16,
            sys::fi_datatype_FI_UINT16 => Self::U16,
            sys::fi_datatype_FI_INT32 => Self::I32,
            sys::fi_datatype_FI_UINT32 => Self::U32,
            sys::fi_datatype_FI_INT64 => Self::I64,
            sys::fi_datatype_FI_UINT64 => Self::U64,
            sys::fi_datatype_FI_INT128 => Self::I128,
            sys::fi_datatype_FI_UINT128 => Self::U128,
            sys::fi_datatype_FI_FLOAT => Self::F32,
            sys::fi_datatype_FI_DOUBLE => Self::F64,
            sys::fi_datatype_FI_FLOAT_COMPLEX => Self::ComplexF32,
            sys::fi_datatype_FI_DOUBLE_COMPLEX => Self::ComplexF64,
            // FI_LONG_DOUBLE, FI_LONG_DOUBLE_COMPLEX, FI_VOID, unknown.
            other => return Err(AtomicError::Datatype(other)),
        })
    }

    /// As `enum fi_datatype`.
    pub fn to_fi(self) -> u32 {
        match self {
            Self::I8 => sys::fi_datatype_FI_INT8,
            Self::U8 => sys::fi_datatype_FI_UINT8,
            Self::I16 => sys::fi_datatype_FI_INT16,
            Self::U16 => sys::fi_datatype_FI_UINT16,
            Self::I32 => sys::fi_datatype_FI_INT32,
            Self::U32 => sys::fi_datatype_FI_UINT32,
            Self::I64 => sys::fi_datatype_FI_INT64,
            Self::U64 => sys::fi_datatype_FI_UINT64,
            Self::I128 => sys::fi_datatype_FI_INT128,
            Self::U128 => sys::fi_datatype_FI_UINT128,
            Self::F32 => sys::fi_datatype_FI_FLOAT,
            Self::F64 => sys::fi_datatype_FI_DOUBLE,
            Self::ComplexF32 => sys::fi_datatype_FI_FLOAT_COMPLEX,
            Self::ComplexF64 => sys::fi_datatype_FI_DOUBLE_COMPLEX,
        }
    }

    /// The libfabric name.
    pub fn name(self) -> &'static str {
        match self {
            Self::I8 => "FI_INT8",
            Self::U8 => "FI_UINT8",
            Self::I16 => "FI_INT16",
            Self::U16 => "FI_UINT16",
            Self::I32 => "FI_INT32",
            Self::U32 => "FI_UINT32",
            Self::I64 => "FI_INT64",
            Self::U64 => "FI_UINT64",
            Self::I128 => "FI_INT128",
            Self::U128 => "FI_UINT128",
            Self::F32 => "FI_FLOAT",
            Self::F64 => "FI_DOUBLE",
            Self::ComplexF32 => "FI_FLOAT_COMPLEX",
            Self::ComplexF64 => "FI_DOUBLE_COMPLEX",
        }
    }

    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            Self::I8 | Self::U8 => 1,
            Self::I16 | Self::U16 => 2,
            Self::I32 | Self::U32 | Self::F32 => 4,
            Self::I64 | Self::U64 | Self::F64 | Self::ComplexF32 => 8,
            Self::I128 | Self::U128 | Self::ComplexF64 => 16,
        }
    }

    fn class(self) -> Class {
        match self {
            Self::F32 | Self::F64 => Class::Real,
            Self::ComplexF32 | Self::ComplexF64 => Class::Complex,
            _ => Class::Integer,
        }
    }
}

impl Op {
    /// From `enum fi_op`.
    pub fn from_fi(v: u32) -> Result<Self, AtomicError> {
        Ok(match v {
            sys::fi_op_FI_MIN => Self::Min,
            sys::fi_op_FI_MAX => Self::Max,
            sys::fi_op_FI_SUM => Self::Sum,
            sys::fi_op_FI_PROD => Self::Prod,
            sys::fi_op_FI_LOR => Self::Lor,
            sys::fi_op_FI_LAND => Self::Land,
            sys::fi_op_FI_BOR => Self::Bor,
            sys::fi_op_FI_BAND => Self::Band,
            sys::fi_op_FI_LXOR => Self::Lxor,
            sys::fi_op_FI_BXOR => Self::Bxor,
            sys::fi_op_FI_ATOMIC_READ => Self::Read,
            sys::fi_op_FI_ATOMIC_WRITE => Self::Write,
            sys::fi_op_FI_CSWAP => Self::Cswap,
            sys::fi_op_FI_CSWAP_NE => Self::CswapNe,
            sys::fi_op_FI_CSWAP_LE => Self::CswapLe,
            sys::fi_op_FI_CSWAP_LT => Self::CswapLt,
            sys::fi_op_FI_CSWAP_GE => Self::CswapGe,
            sys::fi_op_FI_CSWAP_GT => Self::CswapGt,
            sys::fi_op_FI_MSWAP => Self::Mswap,
            other => return Err(AtomicError::UnknownOp(other)),
        })
    }

    /// As `enum fi_op`.
    pub fn to_fi(self) -> u32 {
        match self {
            Self::Min => sys::fi_op_FI_MIN,
            Self::Max => sys::fi_op_FI_MAX,
            Self::Sum => sys::fi_op_FI_SUM,
            Self::Prod => sys::fi_op_FI_PROD,
            Self::Lor => sys::fi_op_FI_LOR,
            Self::Land => sys::fi_op_FI_LAND,
            Self::Bor => sys::fi_op_FI_BOR,
            Self::Band => sys::fi_op_FI_BAND,
            Self::Lxor => sys::fi_op_FI_LXOR,
            Self::Bxor => sys::fi_op_FI_BXOR,
            Self::Read => sys::fi_op_FI_ATOMIC_READ,
            Self::Write => sys::fi_op_FI_ATOMIC_WRITE,
            Self::Cswap => sys::fi_op_FI_CSWAP,
            Self::CswapNe => sys::fi_op_FI_CSWAP_NE,
            Self::CswapLe => sys::fi_op_FI_CSWAP_LE,
            Self::CswapLt => sys::fi_op_FI_CSWAP_LT,
            Self::CswapGe => sys::fi_op_FI_CSWAP_GE,
            Self::CswapGt => sys::fi_op_FI_CSWAP_GT,
            Self::Mswap => sys::fi_op_FI_MSWAP,
        }
    }

    /// The libfabric name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Min => "FI_MIN",
            Self::Max => "FI_MAX",
            Self::Sum => "FI_SUM",
            Self::Prod => "FI_PROD",
            Self::Lor => "FI_LOR",
            Self::Land => "FI_LAND",
            Self::Bor => "FI_BOR",
            Self::Band => "FI_BAND",
            Self::Lxor => "FI_LXOR",
            Self::Bxor => "FI_BXOR",
            Self::Read => "FI_ATOMIC_READ",
            Self::Write => "FI_ATOMIC_WRITE",
            Self::Cswap => "FI_CSWAP",
            Self::CswapNe => "FI_CSWAP_NE",
            Self::CswapLe => "FI_CSWAP_LE",
            Self::CswapLt => "FI_CSWAP_LT",
            Self::CswapGe => "FI_CSWAP_GE",
            Self::CswapGt => "FI_CSWAP_GT",
            Self::Mswap => "FI_MSWAP",
        }
    }

    /// The family of calls this operation belongs to; FI_ATOMIC_READ and
    /// every base operation are also fetch operations.
    fn allowed_in(self, call: Call) -> bool {
        match self {
            Self::Read => call == Call::Fetch,
            Self::Cswap
            | Self::CswapNe
            | Self::CswapLe
            | Self::CswapLt
            | Self::CswapGe
            | Self::CswapGt
            | Self::Mswap => call == Call::Compare,
            _ => call != Call::Compare,
        }
    }

    /// Whether the operation is defined on values of `class`: bitwise
    /// ones on integers only, orderings not on complex numbers.
    fn defined_on(self, class: Class) -> bool {
        match self {
            Self::Bor | Self::Band | Self::Bxor | Self::Mswap => class == Class::Integer,
            Self::Min
            | Self::Max
            | Self::CswapLe
            | Self::CswapLt
            | Self::CswapGe
            | Self::CswapGt => class != Class::Complex,
            Self::Sum
            | Self::Prod
            | Self::Lor
            | Self::Land
            | Self::Lxor
            | Self::Read
            | Self::Write
            | Self::Cswap
            | Self::CswapNe => true,
        }
    }

    /// Whether the operation changes the target (all but FI_ATOMIC_READ).
    pub fn modifies(self) -> bool {
        self != Self::Read
    }
}

impl Call {
    /// The libfabric name of the family.
    pub fn name(self) -> &'static str {
        match self {
            Self::Base => "base",
            Self::Fetch => "fetch",
            Self::Compare => "compare",
        }
    }

    /// The family's basic libfabric call, for messages.
    pub fn function(self) -> &'static str {
        match self {
            Self::Base => "fi_atomic",
            Self::Fetch => "fi_fetch_atomic",
            Self::Compare => "fi_compare_atomic",
        }
    }

    /// Operand arrays a request carries per element: the operand, and for
    /// compare calls the compare values.
    fn operand_arrays(self) -> usize {
        match self {
            Self::Base | Self::Fetch => 1,
            Self::Compare => 2,
        }
    }

    /// Whether the original values come back.
    pub fn fetches(self) -> bool {
        self != Self::Base
    }
}

/// Whether the provider carries out `op` on `datatype` through `call`:
/// the answer of `fi_atomicvalid` and friends and of `fi_query_atomic`.
pub fn check(call: Call, op: Op, datatype: Datatype) -> Result<(), AtomicError> {
    if !op.allowed_in(call) {
        return Err(AtomicError::WrongCall {
            op: op.name(),
            call: call.name(),
        });
    }
    if !op.defined_on(datatype.class()) {
        return Err(AtomicError::WrongDatatype {
            op: op.name(),
            datatype: datatype.name(),
        });
    }
    Ok(())
}

/// The most elements one atomic of `datatype` through `call` carries, so
/// that the request (operands and compare values) and the reply (the
/// original values) each fit in one eager message of `eager_limit_bytes`.
pub fn max_count(call: Call, datatype: Datatype, eager_limit_bytes: usize) -> usize {
    eager_limit_bytes / (datatype.size_bytes() * call.operand_arrays())
}

/// The answer to `fi_atomicvalid` / `fi_fetch_atomicvalid` /
/// `fi_compare_atomicvalid` (by `call`) and `fi_query_atomic` for the
/// libfabric values `op` and `datatype`: the most elements one call
/// carries and the bytes per element, or why not.
pub fn query(
    call: Call,
    op: u32,
    datatype: u32,
    eager_limit_bytes: usize,
) -> Result<(usize, usize), AtomicError> {
    let op = Op::from_fi(op)?;
    let datatype = Datatype::from_fi(datatype)?;
    check(call, op, datatype)?;
    Ok((
        max_count(call, datatype, eager_limit_bytes),
        datatype.size_bytes(),
    ))
}

/// One atomic request, as the initiator describes it to the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// The family of calls.
    pub call: Call,
    /// The operation.
    pub op: Op,
    /// The element type.
    pub datatype: Datatype,
    /// Elements.
    pub count: u32,
}

/// Wire code of a call family in [`Request::to_wire`].
fn call_code(c: Call) -> u64 {
    match c {
        Call::Base => 0,
        Call::Fetch => 1,
        Call::Compare => 2,
    }
}

impl Request {
    /// A request the provider can carry out, with at most
    /// [`max_count`] elements for `eager_limit_bytes`.
    pub fn new(
        call: Call,
        op: Op,
        datatype: Datatype,
        count: usize,
        eager_limit_bytes: usize,
    ) -> Result<Self, AtomicError> {
        check(call, op, datatype)?;
        if count == 0 {
            return Err(AtomicError::NoElements);
        }
        let max = max_count(call, datatype, eager_limit_bytes);
        if count > max {
            return Err(AtomicError::TooMany { count, max });
        }
        let count = u32::try_from(count).map_err(|_| AtomicError::TooMany {
            count,
            max: u32::MAX as usize,
        })?;
        Ok(Self {
            call,
            op,
            datatype,
            count,
        })
    }

    /// Bytes of target memory the request touches (and of each operand
    /// array and of the reply's original values).
    pub fn target_bytes(&self) -> usize {
        self.count as usize * self.datatype.size_bytes()
    }

    /// Payload bytes of the request message: the operands (none for
    /// FI_ATOMIC_READ), then the compare values (compare calls).
    pub fn payload_bytes(&self) -> usize {
        let operands = if self.op == Op::Read {
            0
        } else {
            self.target_bytes()
        };
        let compares = if self.call == Call::Compare {
            self.target_bytes()
        } else {
            0
        };
        operands + compares
    }

    /// The remote access the target region must allow: write for base
    /// calls, read for FI_ATOMIC_READ, both for other fetch and compare
    /// calls (`fi_atomic(3)`: fetch targets must allow remote reads).
    pub fn access_needed(&self) -> u64 {
        let read = sys::FI_REMOTE_READ as u64;
        let write = sys::FI_REMOTE_WRITE as u64;
        match (self.call, self.op) {
            (Call::Base, _) => write,
            (_, Op::Read) => read,
            _ => read | write,
        }
    }

    /// The request in one 64-bit header field (`wire`'s `tag`): operation
    /// (bits 0..8), datatype (8..16), call family (16..18), element count
    /// (32..64). Operations and datatypes travel as their libfabric values.
    pub fn to_wire(&self) -> u64 {
        u64::from(self.op.to_fi() & 0xff)
            | (u64::from(self.datatype.to_fi() & 0xff) << 8)
            | (call_code(self.call) << 16)
            | (u64::from(self.count) << 32)
    }

    /// Decode a peer's request field, checking it is one the provider
    /// carries out with at most `max_count` elements for
    /// `eager_limit_bytes`.
    pub fn from_wire(v: u64, eager_limit_bytes: usize) -> Result<Self, AtomicError> {
        let op = Op::from_fi((v & 0xff) as u32)?;
        let datatype = Datatype::from_fi(((v >> 8) & 0xff) as u32)?;
        let call = match (v >> 16) & 0xffff {
            0 => Call::Base,
            1 => Call::Fetch,
            2 => Call::Compare,
            _ => return Err(AtomicError::Malformed("unknown call family")),
        };
        Self::new(call, op, datatype, (v >> 32) as usize, eager_limit_bytes)
    }

    /// Apply the request to `target` (the [`Request::target_bytes`] bytes
    /// at the target address) with the request message's `payload`. The
    /// caller holds [`TARGET_LOCK`] and has kept the original values if
    /// it fetches.
    pub fn apply(&self, target: &mut [u8], payload: &[u8]) -> Result<(), AtomicError> {
        let n = self.target_bytes();
        if target.len() != n {
            return Err(AtomicError::Malformed("target length"));
        }
        if payload.len() != self.payload_bytes() {
            return Err(AtomicError::Malformed("payload length"));
        }
        if self.op == Op::Read {
            return Ok(());
        }
        let (operand, compare) = payload.split_at(n);
        let ok = match self.datatype {
            Datatype::I8 => run::<i8>(self.op, target, operand, compare),
            Datatype::U8 => run::<u8>(self.op, target, operand, compare),
            Datatype::I16 => run::<i16>(self.op, target, operand, compare),
            Datatype::U16 => run::<u16>(self.op, target, operand, compare),
            Datatype::I32 => run::<i32>(self.op, target, operand, compare),
            Datatype::U32 => run::<u32>(self.op, target, operand, compare),
            Datatype::I64 => run::<i64>(self.op, target, operand, compare),
            Datatype::U64 => run::<u64>(self.op, target, operand, compare),
            Datatype::I128 => run::<i128>(self.op, target, operand, compare),
            Datatype::U128 => run::<u128>(self.op, target, operand, compare),
            Datatype::F32 => run::<f32>(self.op, target, operand, compare),
            Datatype::F64 => run::<f64>(self.op, target, operand, compare),
            Datatype::ComplexF32 => run::<Complex<f32>>(self.op, target, operand, compare),
            Datatype::ComplexF64 => run::<Complex<f64>>(self.op, target, operand, compare),
        };
        // `new` admitted only defined pairs, and `combine` defines exactly
        // those (a unit test holds the two together).
        ok.then_some(()).ok_or(AtomicError::WrongDatatype {
            op: self.op.name(),
            datatype: self.datatype.name(),
        })
    }
}

/// An element the provider computes with.
trait Element: Copy {
    const SIZE: usize;
    fn load(b: &[u8]) -> Self;
    fn store(self, b: &mut [u8]);
    /// The new target value for operation `op` on target `t`, operand `o`
    /// and compare value `c` (unused by non-compare operations); `None`
    /// when `op` is not defined on the type.
    fn combine(op: Op, t: Self, o: Self, c: Self) -> Option<Self>;
}

/// Run `op` element by element; false if `op` is not defined on `T`.
fn run<T: Element>(op: Op, target: &mut [u8], operand: &[u8], compare: &[u8]) -> bool {
    for (i, t) in target.chunks_exact_mut(T::SIZE).enumerate() {
        let at = i * T::SIZE..(i + 1) * T::SIZE;
        let o = T::load(&operand[at.clone()]);
        // Non-compare calls carry no compare values: the operand stands in
        // (never read).
        let c = compare.get(at).map_or(o, T::load);
        match T::combine(op, T::load(t), o, c) {
            Some(v) => v.store(t),
            None => return false,
        }
    }
    true
}

/// The new value of the compare-and-swap family: `o` if the comparison of
/// compare value `c` against target `t` holds.
fn swap_if<T: PartialOrd>(op: Op, t: T, o: T, c: T) -> Option<T> {
    let hold = match op {
        Op::Cswap => c == t,
        Op::CswapNe => c != t,
        Op::CswapLe => c <= t,
        Op::CswapLt => c < t,
        Op::CswapGe => c >= t,
        Op::CswapGt => c > t,
        _ => return None,
    };
    Some(if hold { o } else { t })
}

macro_rules! integer_element {
    ($($t:ty),*) => {$(
        impl Element for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn load(b: &[u8]) -> Self {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(b);
                <$t>::from_ne_bytes(a)
            }
            fn store(self, b: &mut [u8]) {
                b.copy_from_slice(&self.to_ne_bytes());
            }
            fn combine(op: Op, t: Self, o: Self, c: Self) -> Option<Self> {
                let truth = |v: bool| if v { 1 } else { 0 };
                Some(match op {
                    Op::Min => if o < t { o } else { t },
                    Op::Max => if o > t { o } else { t },
                    Op::Sum => t.wrapping_add(o),
                    Op::Prod => t.wrapping_mul(o),
                    Op::Lor => truth(t != 0 || o != 0),
                    Op::Land => truth(t != 0 && o != 0),
                    Op::Lxor => truth((t != 0) != (o != 0)),
                    Op::Bor => t | o,
                    Op::Band => t & o,
                    Op::Bxor => t ^ o,
                    Op::Read => t,
                    Op::Write => o,
                    Op::Mswap => (o & c) | (t & !c),
                    _ => return swap_if(op, t, o, c),
                })
            }
        }
    )*};
}
integer_element!(i8, u8, i16, u16, i32, u32, i64, u64, i128, u128);

macro_rules! real_element {
    ($($t:ty),*) => {$(
        impl Element for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn load(b: &[u8]) -> Self {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(b);
                <$t>::from_ne_bytes(a)
            }
            fn store(self, b: &mut [u8]) {
                b.copy_from_slice(&self.to_ne_bytes());
            }
            fn combine(op: Op, t: Self, o: Self, c: Self) -> Option<Self> {
                let truth = |v: bool| if v { 1.0 } else { 0.0 };
                Some(match op {
                    // As C's `if (buf < addr) addr = buf`: a NaN never replaces.
                    Op::Min => if o < t { o } else { t },
                    Op::Max => if o > t { o } else { t },
                    Op::Sum => t + o,
                    Op::Prod => t * o,
                    Op::Lor => truth(t != 0.0 || o != 0.0),
                    Op::Land => truth(t != 0.0 && o != 0.0),
                    Op::Lxor => truth((t != 0.0) != (o != 0.0)),
                    Op::Read => t,
                    Op::Write => o,
                    Op::Bor | Op::Band | Op::Bxor | Op::Mswap => return None,
                    _ => return swap_if(op, t, o, c),
                })
            }
        }
    )*};
}
real_element!(f32, f64);

/// A complex number as C lays it out: real part, then imaginary part.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Complex<T> {
    re: T,
    im: T,
}

macro_rules! complex_element {
    ($($t:ty),*) => {$(
        impl Element for Complex<$t> {
            const SIZE: usize = 2 * <$t as Element>::SIZE;
            fn load(b: &[u8]) -> Self {
                let (re, im) = b.split_at(<$t as Element>::SIZE);
                Self { re: <$t>::load(re), im: <$t>::load(im) }
            }
            fn store(self, b: &mut [u8]) {
                let (re, im) = b.split_at_mut(<$t as Element>::SIZE);
                self.re.store(re);
                self.im.store(im);
            }
            fn combine(op: Op, t: Self, o: Self, c: Self) -> Option<Self> {
                // C: a complex value is true when either part is nonzero.
                let nonzero = |z: Self| z.re != 0.0 || z.im != 0.0;
                let truth = |v: bool| Self { re: if v { 1.0 } else { 0.0 }, im: 0.0 };
                Some(match op {
                    Op::Sum => Self { re: t.re + o.re, im: t.im + o.im },
                    Op::Prod => Self {
                        re: t.re * o.re - t.im * o.im,
                        im: t.re * o.im + t.im * o.re,
                    },
                    Op::Lor => truth(nonzero(t) || nonzero(o)),
                    Op::Land => truth(nonzero(t) && nonzero(o)),
                    Op::Lxor => truth(nonzero(t) != nonzero(o)),
                    Op::Read => t,
                    Op::Write => o,
                    Op::Cswap => if c == t { o } else { t },
                    Op::CswapNe => if c != t { o } else { t },
                    _ => return None,
                })
            }
        }
    )*};
}
complex_element!(f32, f64);

#[cfg(test)]
mod tests {
    use super::*;

    const EAGER: usize = 16384;

    fn bytes<T: Element>(v: &[T]) -> Vec<u8> {
        let mut out = vec![0u8; v.len() * T::SIZE];
        for (x, b) in v.iter().zip(out.chunks_exact_mut(T::SIZE)) {
            x.store(b);
        }
        out
    }

    fn values<T: Element>(b: &[u8]) -> Vec<T> {
        b.chunks_exact(T::SIZE).map(T::load).collect()
    }

    /// Apply `op` through `call` to `target` with `operand` (and `compare`).
    fn apply<T: Element>(
        call: Call,
        op: Op,
        dt: Datatype,
        target: &[T],
        operand: &[T],
        compare: &[T],
    ) -> Vec<T> {
        assert_eq!(
            T::SIZE,
            dt.size_bytes(),
            "test values of the wrong type for {}",
            dt.name()
        );
        let r = Request::new(call, op, dt, target.len(), EAGER).unwrap();
        let mut t = bytes(target);
        let mut payload = if op == Op::Read {
            Vec::new()
        } else {
            bytes(operand)
        };
        payload.extend(bytes(compare));
        r.apply(&mut t, &payload).unwrap();
        values(&t)
    }

    #[test]
    fn the_table_and_the_arithmetic_agree_on_every_pair() {
        // `check` (what the valid queries answer) admits a pair exactly
        // when the arithmetic defines it: no advertised pair fails at the
        // target, no computable pair is refused.
        for dt in DATATYPES {
            for op in OPS {
                // A compare request carries every operand an op may use.
                let r = Request {
                    call: Call::Compare,
                    op,
                    datatype: dt,
                    count: 1,
                };
                let mut target = vec![1u8; r.target_bytes()];
                let defined = r.apply(&mut target, &vec![1u8; r.payload_bytes()]).is_ok();
                let admitted = [Call::Base, Call::Fetch, Call::Compare]
                    .into_iter()
                    .any(|c| check(c, op, dt).is_ok());
                assert_eq!(defined, admitted, "{} on {}", op.name(), dt.name());
            }
        }
    }

    #[test]
    fn what_maps_to_metaroce_natives_is_offered() {
        // The pairs with MetaRoCE transport equivalents (8-byte fetch-add,
        // compare-swap; read as fetch-add 0; write as swap).
        for dt in [Datatype::U64, Datatype::I64] {
            assert!(check(Call::Fetch, Op::Sum, dt).is_ok());
            assert!(check(Call::Base, Op::Sum, dt).is_ok());
            assert!(check(Call::Compare, Op::Cswap, dt).is_ok());
            assert!(check(Call::Fetch, Op::Read, dt).is_ok());
            assert!(check(Call::Base, Op::Write, dt).is_ok());
            assert!(check(Call::Fetch, Op::Write, dt).is_ok());
        }
    }

    #[test]
    fn calls_allow_their_own_operations_only() {
        let dt = Datatype::U32;
        assert!(check(Call::Base, Op::Read, dt).is_err());
        assert!(check(Call::Fetch, Op::Read, dt).is_ok());
        assert!(check(Call::Compare, Op::Read, dt).is_err());
        for op in [
            Op::Cswap,
            Op::CswapNe,
            Op::CswapLe,
            Op::CswapLt,
            Op::CswapGe,
            Op::CswapGt,
            Op::Mswap,
        ] {
            assert!(check(Call::Compare, op, dt).is_ok());
            assert!(check(Call::Base, op, dt).is_err());
            assert!(check(Call::Fetch, op, dt).is_err());
        }
        for op in [
            Op::Min,
            Op::Max,
            Op::Sum,
            Op::Prod,
            Op::Lor,
            Op::Land,
            Op::Bor,
            Op::Band,
            Op::Lxor,
            Op::Bxor,
            Op::Write,
        ] {
            assert!(check(Call::Base, op, dt).is_ok());
            assert!(check(Call::Fetch, op, dt).is_ok());
            assert!(check(Call::Compare, op, dt).is_err());
        }
    }

    #[test]
    fn datatypes_allow_what_is_defined_on_them() {
        assert!(check(Call::Base, Op::Bor, Datatype::F64).is_err());
        assert!(check(Call::Compare, Op::Mswap, Datatype::F32).is_err());
        assert!(check(Call::Base, Op::Min, Datatype::ComplexF64).is_err());
        assert!(check(Call::Compare, Op::CswapLt, Datatype::ComplexF32).is_err());
        assert!(check(Call::Compare, Op::Cswap, Datatype::ComplexF32).is_ok());
        assert!(check(Call::Base, Op::Prod, Datatype::ComplexF64).is_ok());
        assert!(check(Call::Base, Op::Max, Datatype::F64).is_ok());
        assert!(check(Call::Compare, Op::Mswap, Datatype::U128).is_ok());
        let e = check(Call::Base, Op::Bxor, Datatype::F32).unwrap_err();
        assert_eq!(e.to_string(), "FI_BXOR is not defined on FI_FLOAT");
        assert_eq!(e.fi_errno(), sys::FI_EOPNOTSUPP as i32);
    }

    #[test]
    fn libfabric_values_round_trip_and_long_double_is_refused() {
        for dt in DATATYPES {
            assert_eq!(Datatype::from_fi(dt.to_fi()), Ok(dt));
        }
        for op in OPS {
            assert_eq!(Op::from_fi(op.to_fi()), Ok(op));
        }
        for v in [
            sys::fi_datatype_FI_LONG_DOUBLE,
            sys::fi_datatype_FI_LONG_DOUBLE_COMPLEX,
            sys::fi_datatype_FI_VOID,
            99,
        ] {
            let e = Datatype::from_fi(v).unwrap_err();
            assert_eq!(e.fi_errno(), sys::FI_EOPNOTSUPP as i32);
        }
        assert_eq!(
            Datatype::from_fi(sys::fi_datatype_FI_LONG_DOUBLE)
                .unwrap_err()
                .to_string(),
            "datatype FI_LONG_DOUBLE is not supported for atomics (see docs/libfabric.md)"
        );
        assert!(Op::from_fi(sys::fi_op_FI_ATOMIC_OP_LAST).is_err());
        assert!(Op::from_fi(sys::fi_op_FI_NOOP).is_err());
    }

    #[test]
    fn counts_are_bounded_by_one_eager_message() {
        assert_eq!(max_count(Call::Fetch, Datatype::U64, EAGER), 2048);
        assert_eq!(max_count(Call::Compare, Datatype::U64, EAGER), 1024);
        assert_eq!(max_count(Call::Base, Datatype::U8, EAGER), EAGER);
        assert_eq!(max_count(Call::Compare, Datatype::ComplexF64, EAGER), 512);
        let e = Request::new(Call::Compare, Op::Cswap, Datatype::U64, 1025, EAGER).unwrap_err();
        assert_eq!(
            e,
            AtomicError::TooMany {
                count: 1025,
                max: 1024
            }
        );
        assert_eq!(e.fi_errno(), sys::FI_EMSGSIZE as i32);
        let e = Request::new(Call::Base, Op::Sum, Datatype::U64, 0, EAGER).unwrap_err();
        assert_eq!(e.fi_errno(), sys::FI_EINVAL as i32);
    }

    #[test]
    fn requests_round_trip_and_bad_fields_are_refused() {
        let r = Request::new(Call::Compare, Op::CswapGe, Datatype::I16, 77, EAGER).unwrap();
        assert_eq!(Request::from_wire(r.to_wire(), EAGER), Ok(r));
        assert_eq!(r.payload_bytes(), 2 * 77 * 2);
        let read = Request::new(Call::Fetch, Op::Read, Datatype::U64, 3, EAGER).unwrap();
        assert_eq!(read.payload_bytes(), 0);
        assert_eq!(read.access_needed(), sys::FI_REMOTE_READ as u64);
        let base = Request::new(Call::Base, Op::Sum, Datatype::U64, 1, EAGER).unwrap();
        assert_eq!(base.access_needed(), sys::FI_REMOTE_WRITE as u64);
        // A peer's field naming a pair, a family or a count the provider
        // does not carry out is refused, never applied.
        let mut v = r.to_wire();
        v = (v & !(0xffff << 16)) | (7 << 16);
        assert!(Request::from_wire(v, EAGER).is_err());
        let wrong = (r.to_wire() & !0xff) | u64::from(sys::fi_op_FI_SUM);
        assert!(matches!(
            Request::from_wire(wrong, EAGER),
            Err(AtomicError::WrongCall { .. })
        ));
        let huge = (r.to_wire() & 0xffff_ffff) | (u64::from(u32::MAX) << 32);
        assert!(matches!(
            Request::from_wire(huge, EAGER),
            Err(AtomicError::TooMany { .. })
        ));
        let long_double =
            (base.to_wire() & !0xff00) | (u64::from(sys::fi_datatype_FI_LONG_DOUBLE) << 8);
        assert!(matches!(
            Request::from_wire(long_double, EAGER),
            Err(AtomicError::Datatype(_))
        ));
        // Every field value decodes or is refused without a panic.
        for b in 0..=255u64 {
            let _ = Request::from_wire(b | (b << 8) | (b << 16) | (b << 40), EAGER);
        }
        // Lengths that disagree with the request are refused.
        let mut t = [0u8; 8];
        assert!(base.apply(&mut t, &[0; 4]).is_err());
        assert!(base.apply(&mut t[..4], &[0; 8]).is_err());
    }

    #[test]
    fn integer_operations() {
        let f = Call::Fetch;
        assert_eq!(
            apply(f, Op::Sum, Datatype::U64, &[u64::MAX, 5], &[2, 6], &[]),
            vec![1, 11]
        );
        assert_eq!(
            apply(f, Op::Prod, Datatype::I32, &[-3, 7], &[4, -2], &[]),
            vec![-12, -14]
        );
        assert_eq!(
            apply(f, Op::Min, Datatype::I8, &[-3i8, 7], &[4, -2], &[]),
            vec![-3, -2]
        );
        assert_eq!(
            apply(f, Op::Max, Datatype::U16, &[3u16, 700], &[4, 2], &[]),
            vec![4, 700]
        );
        assert_eq!(
            apply(
                f,
                Op::Lor,
                Datatype::U8,
                &[0u8, 0, 5, 5],
                &[0, 9, 0, 9],
                &[]
            ),
            vec![0, 1, 1, 1]
        );
        assert_eq!(
            apply(
                f,
                Op::Land,
                Datatype::U8,
                &[0u8, 0, 5, 5],
                &[0, 9, 0, 9],
                &[]
            ),
            vec![0, 0, 0, 1]
        );
        assert_eq!(
            apply(
                f,
                Op::Lxor,
                Datatype::U8,
                &[0u8, 0, 5, 5],
                &[0, 9, 0, 9],
                &[]
            ),
            vec![0, 1, 1, 0]
        );
        assert_eq!(
            apply(f, Op::Bor, Datatype::U32, &[0b1100u32], &[0b1010], &[]),
            vec![0b1110]
        );
        assert_eq!(
            apply(f, Op::Band, Datatype::U32, &[0b1100u32], &[0b1010], &[]),
            vec![0b1000]
        );
        assert_eq!(
            apply(f, Op::Bxor, Datatype::U32, &[0b1100u32], &[0b1010], &[]),
            vec![0b0110]
        );
        assert_eq!(
            apply(f, Op::Read, Datatype::U64, &[9u64, 8], &[], &[]),
            vec![9, 8]
        );
        assert_eq!(
            apply(
                f,
                Op::Write,
                Datatype::I128,
                &[9i128, 8],
                &[-1, 1i128 << 100],
                &[]
            ),
            vec![-1, 1i128 << 100]
        );
        assert_eq!(
            apply(Call::Base, Op::Sum, Datatype::U128, &[u128::MAX], &[1], &[]),
            vec![0]
        );
    }

    #[test]
    fn compare_operations() {
        let c = Call::Compare;
        let t = [5u64, 5, 5];
        // compare values below, at and above the target
        let cmp = [4u64, 5, 6];
        let o = [9u64, 9, 9];
        assert_eq!(
            apply(c, Op::Cswap, Datatype::U64, &t, &o, &cmp),
            vec![5, 9, 5]
        );
        assert_eq!(
            apply(c, Op::CswapNe, Datatype::U64, &t, &o, &cmp),
            vec![9, 5, 9]
        );
        assert_eq!(
            apply(c, Op::CswapLe, Datatype::U64, &t, &o, &cmp),
            vec![9, 9, 5]
        );
        assert_eq!(
            apply(c, Op::CswapLt, Datatype::U64, &t, &o, &cmp),
            vec![9, 5, 5]
        );
        assert_eq!(
            apply(c, Op::CswapGe, Datatype::U64, &t, &o, &cmp),
            vec![5, 9, 9]
        );
        assert_eq!(
            apply(c, Op::CswapGt, Datatype::U64, &t, &o, &cmp),
            vec![5, 5, 9]
        );
        assert_eq!(
            apply(
                c,
                Op::Mswap,
                Datatype::U8,
                &[0b1010_1010u8],
                &[0b0101_0101],
                &[0b0000_1111]
            ),
            vec![0b1010_0101]
        );
        assert_eq!(
            apply(c, Op::CswapLt, Datatype::I16, &[-5i16], &[1], &[-6]),
            vec![1]
        );
    }

    #[test]
    fn real_and_complex_operations() {
        let f = Call::Fetch;
        assert_eq!(
            apply(f, Op::Sum, Datatype::F64, &[1.5, -2.0], &[0.25, 2.0], &[]),
            vec![1.75, 0.0]
        );
        assert_eq!(
            apply(
                f,
                Op::Min,
                Datatype::F32,
                &[1.5, f32::INFINITY],
                &[0.25, 2.0],
                &[]
            ),
            vec![0.25, 2.0]
        );
        let nan = apply(f, Op::Max, Datatype::F64, &[1.0], &[f64::NAN], &[]);
        assert_eq!(nan, vec![1.0], "a NaN operand never replaces");
        assert_eq!(
            apply(f, Op::Land, Datatype::F64, &[0.5, 0.0], &[2.0, 3.0], &[]),
            vec![1.0, 0.0]
        );
        assert_eq!(
            apply(
                Call::Compare,
                Op::CswapGt,
                Datatype::F64,
                &[1.0],
                &[7.0],
                &[2.0]
            ),
            vec![7.0]
        );
        let z = |re: f64, im: f64| Complex { re, im };
        let z32 = |re: f32, im: f32| Complex { re, im };
        assert_eq!(
            apply(
                f,
                Op::Prod,
                Datatype::ComplexF64,
                &[z(1.0, 2.0)],
                &[z(3.0, -1.0)],
                &[]
            ),
            vec![z(5.0, 5.0)]
        );
        assert_eq!(
            apply(
                f,
                Op::Sum,
                Datatype::ComplexF32,
                &[z32(1.0, 2.0)],
                &[z32(3.0, -1.0)],
                &[]
            ),
            vec![z32(4.0, 1.0)]
        );
        assert_eq!(
            apply(
                f,
                Op::Lor,
                Datatype::ComplexF32,
                &[z32(0.0, 0.0), z32(0.0, 0.0)],
                &[z32(0.0, 0.0), z32(0.0, 2.0)],
                &[]
            ),
            vec![z32(0.0, 0.0), z32(1.0, 0.0)]
        );
        assert_eq!(
            apply(
                Call::Compare,
                Op::Cswap,
                Datatype::ComplexF64,
                &[z(1.0, 2.0), z(1.0, 2.0)],
                &[z(9.0, 9.0), z(9.0, 9.0)],
                &[z(1.0, 2.0), z(1.0, 3.0)]
            ),
            vec![z(9.0, 9.0), z(1.0, 2.0)]
        );
    }
}
