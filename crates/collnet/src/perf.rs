//! nccl-tests' measurement loop over a [`NetComm`]: for each size, an
//! out-of-place and an in-place measurement of `-w` untimed and `-n`
//! timed iterations of `-m` aggregated operations, then `-c` checked runs
//! with fresh inputs, the time combined over ranks as `-a` says and the
//! wrong elements summed over ranks — both with the communicator itself.
//! Rows come out in nccl-tests' format through `metaroce_coll::report`.
//!
//! Blocking (`-z`): 0 starts all iterations and waits once at the end (the
//! state machine queues them, as a CUDA stream does); 1 waits and runs a
//! barrier after every operation; 2 waits after every operation; 3 waits
//! and runs a barrier after every outer iteration, its time not counted.

use crate::check::{count_wrong, prepare};
use crate::{CollNetError, DevBuf, NetComm};
use metaroce_coll::report::{Measurement, PerfCollective, PerfOptions, ResultRow};
use metaroce_coll::{Algorithm, Collective, DataType, OpSpec, P2pGroup, Rank, ReduceOp};
use std::time::{Duration, Instant};

/// One row's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measure {
    /// The collective.
    pub collective: PerfCollective,
    /// Requested size in bytes (nccl-tests' `-b`..`-e` value).
    pub bytes: u64,
    /// Element type.
    pub dtype: DataType,
    /// Operator.
    pub op: ReduceOp,
    /// Root rank (broadcast, reduce).
    pub root: Rank,
    /// `-n`.
    pub iters: u32,
    /// `-w`.
    pub warmup_iters: u32,
    /// `-m`.
    pub agg_iters: u32,
    /// `-c`.
    pub check: u32,
    /// `-z`.
    pub blocking: u32,
    /// `-a`.
    pub average: u32,
    /// Seed of the checked inputs.
    pub seed: u64,
    /// The algorithm (`Auto`: by size, [`Algorithm::resolve`]).
    pub algorithm: Algorithm,
    /// `-R 2`: symmetric receive buffers ([`NetComm::alloc_symmetric`],
    /// `OpSpec::symmetric`).
    pub symmetric: bool,
}

impl Measure {
    /// One row of `collective` at `bytes` with one timed iteration, no
    /// warm-up and one checked run (root 0, seed 1, the library's choice
    /// of algorithm): what a test measures; `coll-perf` fills every field
    /// from nccl-tests' options instead.
    pub fn once(collective: PerfCollective, bytes: u64, dtype: DataType, op: ReduceOp) -> Self {
        Self {
            collective,
            bytes,
            dtype,
            op,
            root: 0,
            iters: 1,
            warmup_iters: 0,
            agg_iters: 1,
            check: 1,
            blocking: 0,
            average: 1,
            seed: 1,
            algorithm: Algorithm::Auto,
            symmetric: false,
        }
    }
}

/// The operation rank `rank` runs for a perf collective of `count`
/// elements (nccl-tests' parameter count).
pub fn spec_for(
    collective: PerfCollective,
    count: u64,
    dtype: DataType,
    op: ReduceOp,
    root: Rank,
    rank: Rank,
    world: u32,
) -> OpSpec {
    let c = match collective {
        PerfCollective::AllReduce => Collective::AllReduce,
        PerfCollective::AllGather => Collective::AllGather,
        PerfCollective::ReduceScatter => Collective::ReduceScatter,
        PerfCollective::AllToAll => Collective::AllToAll,
        PerfCollective::Broadcast => Collective::Broadcast { root },
        PerfCollective::Reduce => Collective::Reduce { root },
        PerfCollective::SendRecv => {
            Collective::SendRecv(P2pGroup::ring_neighbours(rank, world, count))
        }
    };
    OpSpec::new(c, dtype, op, count)
}

/// Send and receive buffers big enough for every measurement up to a size.
#[derive(Debug)]
pub struct Bench {
    send: DevBuf,
    recv: DevBuf,
}

fn bytes_needed(
    comm: &NetComm,
    collective: PerfCollective,
    bytes: u64,
    dtype: DataType,
) -> (u64, u64) {
    let world = comm.world();
    let counts = collective.counts(bytes, dtype, world);
    let e = dtype.size_bytes() as u64;
    let send = counts.send_count * e;
    let recv = counts.recv_count * e;
    (send, send.max(recv))
}

impl Bench {
    /// Buffers for `collective` up to `max_bytes` of the widest type in
    /// `dtypes`; a symmetric receive buffer (a collective call) if
    /// `symmetric`.
    pub fn new(
        comm: &mut NetComm,
        collective: PerfCollective,
        max_bytes: u64,
        dtypes: &[DataType],
        symmetric: bool,
    ) -> Result<Self, CollNetError> {
        let (mut s, mut r) = (0, 0);
        for &d in dtypes {
            let (a, b) = bytes_needed(comm, collective, max_bytes, d);
            s = s.max(a);
            r = r.max(b);
        }
        let recv = if symmetric && r > 0 {
            comm.alloc_symmetric(r)?
        } else {
            comm.alloc(r)?
        };
        Ok(Self {
            send: comm.alloc(s)?,
            recv,
        })
    }

    /// Releases the buffers.
    pub fn free(self, comm: &mut NetComm) -> Result<(), CollNetError> {
        comm.free(self.send)?;
        comm.free(self.recv)
    }

    /// One row: out of place, then in place.
    pub fn measure(&self, comm: &mut NetComm, m: &Measure) -> Result<ResultRow, CollNetError> {
        let world = comm.world();
        let counts = m.collective.counts(m.bytes, m.dtype, world);
        let (type_name, redop, root) = ResultRow::labels(m.collective, m.dtype, m.op, m.root);
        let out_of_place = self.one(comm, m, counts.param_count, false)?;
        let in_place = self.one(comm, m, counts.param_count, true)?;
        Ok(ResultRow {
            size_bytes: counts.size_bytes(m.dtype),
            count: counts.param_count,
            type_name,
            redop,
            root,
            out_of_place,
            in_place,
        })
    }

    fn buffers(
        &self,
        spec: &OpSpec,
        rank: Rank,
        world: u32,
    ) -> Result<(Option<DevBuf>, DevBuf), CollNetError> {
        let sz = spec.buffer_sizes(rank, world);
        let short =
            || CollNetError::Buffer("the bench buffers are smaller than the measurement".into());
        let send = if spec.in_place {
            None
        } else {
            Some(self.send.prefix(sz.send_bytes).ok_or_else(short)?)
        };
        Ok((send, self.recv.prefix(sz.recv_bytes).ok_or_else(short)?))
    }

    fn one(
        &self,
        comm: &mut NetComm,
        m: &Measure,
        count: u64,
        in_place: bool,
    ) -> Result<Measurement, CollNetError> {
        let (rank, world) = (comm.rank(), comm.world());
        let mut spec = spec_for(m.collective, count, m.dtype, m.op, m.root, rank, world);
        spec.in_place = in_place;
        spec.algorithm = m.algorithm;
        spec.symmetric = m.symmetric;
        let (send, recv) = self.buffers(&spec, rank, world)?;
        // Inputs are made, and results checked, in memory of this rank's
        // own, outside the device lock; only the copies take it, a piece
        // at a time (see `NetComm::read_buf`).
        let (send_len, recv_len) = (send.map_or(0, |b| b.len as usize), recv.len as usize);
        let fill = |comm: &NetComm| -> Result<(), CollNetError> {
            let (mut sb, mut rb) = (vec![0u8; send_len], vec![0u8; recv_len]);
            prepare(&spec, rank, world, m.seed, &mut sb, &mut rb);
            if let Some(s) = &send {
                comm.write_buf(s, &sb);
            }
            comm.write_buf(&recv, &rb);
            Ok(())
        };
        fill(comm)?;
        for _ in 0..m.warmup_iters {
            for _ in 0..m.agg_iters.max(1) {
                comm.start(spec.clone(), send.as_ref(), Some(&recv))?;
            }
        }
        comm.wait_all()?;
        comm.barrier()?;
        let mut elapsed = Duration::ZERO;
        let mut t0 = Instant::now();
        for _ in 0..m.iters {
            for _ in 0..m.agg_iters.max(1) {
                comm.start(spec.clone(), send.as_ref(), Some(&recv))?;
                if m.blocking == 1 || m.blocking == 2 {
                    comm.wait_all()?;
                }
                if m.blocking == 1 {
                    comm.barrier()?;
                }
            }
            if m.blocking == 3 {
                comm.wait_all()?;
                elapsed += t0.elapsed();
                comm.barrier()?;
                t0 = Instant::now();
            }
        }
        comm.wait_all()?;
        if m.blocking != 3 {
            elapsed = t0.elapsed();
        }
        let ops = f64::from(m.iters.max(1)) * f64::from(m.agg_iters.max(1));
        let mine = elapsed.as_secs_f64() / ops;
        let seconds = combine_time(comm, mine, m.average)?;
        let wrong = if m.check > 0 {
            let mut w = 0u64;
            for _ in 0..m.check {
                fill(comm)?;
                comm.run(spec.clone(), send.as_ref(), Some(&recv))?;
                let mut got = vec![0u8; recv_len];
                comm.read_buf(&recv, &mut got);
                w += count_wrong(&spec, rank, world, m.seed, &got);
            }
            Some(sum_u64(comm, w)?)
        } else {
            None
        };
        let size = m
            .collective
            .counts(m.bytes, m.dtype, world)
            .size_bytes(m.dtype);
        let (alg_bw, bus_bw) = m.collective.bandwidths(size, seconds, world);
        Ok(Measurement {
            time_us: seconds * 1e6,
            alg_bw,
            bus_bw,
            wrong,
        })
    }
}

/// One row with buffers of its own.
pub fn measure_row(comm: &mut NetComm, m: &Measure) -> Result<ResultRow, CollNetError> {
    let bench = Bench::new(comm, m.collective, m.bytes, &[m.dtype], m.symmetric)?;
    let row = bench.measure(comm, m);
    // A failed measurement leaves its operations pending on the buffers,
    // and freeing them is then refused: report why it failed, not that.
    let row = row?;
    bench.free(comm)?;
    Ok(row)
}

fn scalar_all_reduce(
    comm: &mut NetComm,
    dtype: DataType,
    op: ReduceOp,
    bytes: [u8; 8],
) -> Result<[u8; 8], CollNetError> {
    let spec = OpSpec::new(Collective::AllReduce, dtype, op, 1);
    let mut out = [0u8; 8];
    comm.run_slices(spec, &bytes, &mut out)?;
    Ok(out)
}

/// The time reported per `-a`: 0 rank 0's, 1 the mean, 2 the minimum, 3
/// the maximum over ranks.
fn combine_time(comm: &mut NetComm, mine: f64, average: u32) -> Result<f64, CollNetError> {
    let world = f64::from(comm.world());
    let (op, v) = match average {
        0 => (ReduceOp::Sum, if comm.rank() == 0 { mine } else { 0.0 }),
        2 => (ReduceOp::Min, mine),
        3 => (ReduceOp::Max, mine),
        _ => (ReduceOp::Sum, mine / world),
    };
    let out = scalar_all_reduce(comm, DataType::Float64, op, v.to_ne_bytes())?;
    Ok(f64::from_ne_bytes(out))
}

fn sum_u64(comm: &mut NetComm, v: u64) -> Result<u64, CollNetError> {
    let out = scalar_all_reduce(comm, DataType::Uint64, ReduceOp::Sum, v.to_ne_bytes())?;
    Ok(u64::from_ne_bytes(out))
}

/// Every row nccl-tests would print for `options`: types, then operators,
/// then roots, then sizes (its loop order), each handed to `on_row` as it
/// is measured.
pub fn run(
    comm: &mut NetComm,
    collective: PerfCollective,
    algorithm: Algorithm,
    options: &PerfOptions,
    seed: u64,
    on_row: &mut dyn FnMut(&ResultRow),
) -> Result<Vec<ResultRow>, CollNetError> {
    let dtypes = options.dtypes();
    let ops = if collective.has_redop() {
        options.ops()
    } else {
        vec![ReduceOp::Sum]
    };
    let roots = if collective.has_root() {
        options.roots(comm.world())
    } else {
        vec![0]
    };
    if let Some(&bad) = roots.iter().find(|&&r| r >= comm.world()) {
        return Err(CollNetError::Job(format!(
            "-r {bad}: the root must be a rank, 0..{}",
            comm.world()
        )));
    }
    let sizes = options.sizes();
    let max = sizes.iter().copied().max().unwrap_or(0);
    let bench = Bench::new(comm, collective, max, &dtypes, options.register == 2)?;
    let mut rows = Vec::new();
    for &dtype in &dtypes {
        for &op in &ops {
            for &root in &roots {
                for &bytes in &sizes {
                    let m = Measure {
                        collective,
                        bytes,
                        dtype,
                        op,
                        root,
                        iters: options.iters,
                        warmup_iters: options.warmup_iters,
                        agg_iters: options.agg_iters,
                        check: options.check,
                        blocking: options.blocking,
                        average: options.average,
                        seed: seed ^ bytes,
                        algorithm,
                        symmetric: options.register == 2,
                    };
                    let row = bench.measure(comm, &m)?;
                    on_row(&row);
                    rows.push(row);
                }
            }
        }
    }
    bench.free(comm)?;
    Ok(rows)
}
