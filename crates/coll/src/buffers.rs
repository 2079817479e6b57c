//! Running [`Compute`] actions on bytes in memory.

use crate::action::{Buf, Compute, ComputeKind, Loc};
use crate::kernels::{self, KernelError};

/// A computation that cannot run on the buffers given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    /// An operand reaches past the end of its buffer.
    #[error("{len} bytes at {loc} exceed the {buf_len}-byte buffer")]
    OutOfBounds {
        /// Operand start.
        loc: Loc,
        /// Operand length.
        len: u64,
        /// Length of the buffer.
        buf_len: usize,
    },
    /// A source partially or wholly overlapping the destination (other than
    /// the in-place forms the actions allow).
    #[error("source at {src} overlaps destination at {dst}")]
    Overlap {
        /// Source.
        src: Loc,
        /// Destination.
        dst: Loc,
    },
    /// A destination in the send buffer, which is never written.
    #[error("destination {0} is in the read-only send buffer")]
    ReadOnly(Loc),
    /// The kernel refused the operands.
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

/// One rank's buffers for one operation, as byte slices.
///
/// In place, `send` is empty: no action names [`Buf::Send`] then.
#[derive(Debug)]
pub struct LocalBuffers<'a> {
    /// The operation's input.
    pub send: &'a [u8],
    /// The operation's output.
    pub recv: &'a mut [u8],
    /// The communicator's staging area.
    pub staging: &'a mut [u8],
}

fn span(loc: Loc, len: u64, buf_len: usize) -> Result<(usize, usize), ExecError> {
    let oob = ExecError::OutOfBounds { loc, len, buf_len };
    let start = usize::try_from(loc.offset).map_err(|_| oob.clone())?;
    let end = usize::try_from(len)
        .ok()
        .and_then(|l| start.checked_add(l))
        .ok_or(oob.clone())?;
    if end > buf_len {
        return Err(oob);
    }
    Ok((start, end))
}

impl LocalBuffers<'_> {
    /// The bytes at `loc` (e.g. a [`Write`](crate::Write)'s source).
    pub fn read(&self, loc: Loc, len: u64) -> Result<&[u8], ExecError> {
        let buf: &[u8] = match loc.buf {
            Buf::Send => self.send,
            Buf::Recv => &*self.recv,
            Buf::Staging => &*self.staging,
        };
        let (s, e) = span(loc, len, buf.len())?;
        Ok(&buf[s..e])
    }

    /// Mutable bytes at `loc` (e.g. where a peer's write lands in staging).
    pub fn write(&mut self, loc: Loc, len: u64) -> Result<&mut [u8], ExecError> {
        let buf: &mut [u8] = match loc.buf {
            Buf::Send => return Err(ExecError::ReadOnly(loc)),
            Buf::Recv => &mut *self.recv,
            Buf::Staging => &mut *self.staging,
        };
        let (s, e) = span(loc, len, buf.len())?;
        Ok(&mut buf[s..e])
    }

    /// Splits out the destination mutably and `K` sources immutably; the
    /// sources may lie in the destination's buffer if they do not overlap it.
    fn split<const K: usize>(
        &mut self,
        dst: Loc,
        srcs: [Loc; K],
        len: u64,
    ) -> Result<(&mut [u8], [&[u8]; K]), ExecError> {
        let (target, others): (&mut [u8], [(Buf, &[u8]); 2]) = match dst.buf {
            Buf::Send => return Err(ExecError::ReadOnly(dst)),
            Buf::Recv => (
                &mut *self.recv,
                [(Buf::Send, self.send), (Buf::Staging, &*self.staging)],
            ),
            Buf::Staging => (
                &mut *self.staging,
                [(Buf::Send, self.send), (Buf::Recv, &*self.recv)],
            ),
        };
        let (d0, d1) = span(dst, len, target.len())?;
        let (left, rest) = target.split_at_mut(d0);
        let (mid, right) = rest.split_at_mut(d1 - d0);
        let (left, right): (&[u8], &[u8]) = (left, right);
        let mut out: [&[u8]; K] = [&[]; K];
        for (o, &src) in out.iter_mut().zip(srcs.iter()) {
            *o = if src.buf == dst.buf {
                let (s0, s1) = span(src, len, left.len() + mid.len() + right.len())?;
                if s1 <= d0 {
                    &left[s0..s1]
                } else if s0 >= d1 {
                    &right[s0 - d1..s1 - d1]
                } else {
                    return Err(ExecError::Overlap { src, dst });
                }
            } else {
                let (_, buf) = others
                    .iter()
                    .find(|(b, _)| *b == src.buf)
                    .expect("the two other buffers");
                let (s0, s1) = span(src, len, buf.len())?;
                &buf[s0..s1]
            };
        }
        Ok((mid, out))
    }

    /// Runs `c` on these buffers.
    pub fn execute(&mut self, c: &Compute) -> Result<(), ExecError> {
        match c.kind {
            ComputeKind::Copy { dst, src } => {
                let (d, [s]) = self.split(dst, [src], c.len)?;
                d.copy_from_slice(s);
            }
            ComputeKind::Reduce { dst, a, b } if dst == a => {
                let (d, [y]) = self.split(dst, [b], c.len)?;
                kernels::reduce_in_place(c.reduce_op, c.dtype, d, y)?;
            }
            ComputeKind::Reduce { dst, a, b } => {
                let (d, [x, y]) = self.split(dst, [a, b], c.len)?;
                kernels::reduce(c.reduce_op, c.dtype, d, x, y)?;
            }
            ComputeKind::Premultiply { dst, src } if dst == src => {
                let d = self.write(dst, c.len)?;
                kernels::premultiply_in_place(c.dtype, d, c.world)?;
            }
            ComputeKind::Premultiply { dst, src } => {
                let (d, [s]) = self.split(dst, [src], c.len)?;
                kernels::premultiply(c.dtype, d, s, c.world)?;
            }
            ComputeKind::PostDivide { dst } => {
                let d = self.write(dst, c.len)?;
                kernels::post_divide(c.dtype, d, c.world)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::action::{ComputeId, OpId};
    use crate::datatype::{DataType, ReduceOp};

    fn compute(kind: ComputeKind, len: u64) -> Compute {
        Compute {
            id: ComputeId(0),
            op: OpId(0),
            kind,
            len,
            dtype: DataType::Uint8,
            reduce_op: ReduceOp::Sum,
            world: 2,
        }
    }

    #[test]
    fn same_buffer_operands() {
        let send = [1u8, 2, 3, 4];
        let mut recv = [10u8, 20, 30, 40];
        let mut staging = [0u8; 8];
        let mut b = LocalBuffers {
            send: &send,
            recv: &mut recv,
            staging: &mut staging,
        };
        let at = |buf, o| Loc::new(buf, o);
        // Staging-to-staging with disjoint halves.
        b.execute(&compute(
            ComputeKind::Copy {
                dst: at(Buf::Staging, 0),
                src: at(Buf::Send, 0),
            },
            4,
        ))
        .unwrap();
        b.execute(&compute(
            ComputeKind::Reduce {
                dst: at(Buf::Staging, 4),
                a: at(Buf::Recv, 0),
                b: at(Buf::Staging, 0),
            },
            4,
        ))
        .unwrap();
        assert_eq!(&b.staging[4..], &[11, 22, 33, 44]);
        // In place.
        b.execute(&compute(
            ComputeKind::Reduce {
                dst: at(Buf::Recv, 0),
                a: at(Buf::Recv, 0),
                b: at(Buf::Send, 0),
            },
            4,
        ))
        .unwrap();
        assert_eq!(b.recv, &[11, 22, 33, 44]);
        b.execute(&compute(
            ComputeKind::PostDivide {
                dst: at(Buf::Recv, 0),
            },
            4,
        ))
        .unwrap();
        assert_eq!(b.recv, &[5, 11, 16, 22]);
        // Errors, not panics.
        assert!(matches!(
            b.execute(&compute(
                ComputeKind::Copy {
                    dst: at(Buf::Recv, 1),
                    src: at(Buf::Recv, 0)
                },
                2
            )),
            Err(ExecError::Overlap { .. })
        ));
        assert!(matches!(
            b.execute(&compute(
                ComputeKind::Copy {
                    dst: at(Buf::Recv, 2),
                    src: at(Buf::Send, 0)
                },
                4
            )),
            Err(ExecError::OutOfBounds { .. })
        ));
        assert!(matches!(
            b.execute(&compute(
                ComputeKind::Copy {
                    dst: at(Buf::Send, 0),
                    src: at(Buf::Recv, 0)
                },
                1
            )),
            Err(ExecError::ReadOnly(_))
        ));
        assert!(matches!(
            b.execute(&compute(
                ComputeKind::Copy {
                    dst: at(Buf::Recv, u64::MAX),
                    src: at(Buf::Send, 0)
                },
                1
            )),
            Err(ExecError::OutOfBounds { .. })
        ));
    }
}
