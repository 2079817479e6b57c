//! One-line, tcpdump-like rendering of packets for traces.

use core::fmt;

use crate::{AckRepr, BaseRepr, DataRepr, Flags, OpHeader, Opcode, Packet, Syndrome};

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for Syndrome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for Flags {
    /// `AR` for ACK_REQUEST, `RT` for RETRANSMIT, `CP` for COMPLETION_PROBE,
    /// `AU` for AUTHENTICATED, `IO` for ICRC_OMITTED, `SD` for
    /// SENDER_DRAINED, `RP` for REPAIR, joined by `|`; `-` if none.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (flag, name) in [
            (Self::ACK_REQUEST, "AR"),
            (Self::RETRANSMIT, "RT"),
            (Self::COMPLETION_PROBE, "CP"),
            (Self::AUTHENTICATED, "AU"),
            (Self::ICRC_OMITTED, "IO"),
            (Self::SENDER_DRAINED, "SD"),
            (Self::REPAIR, "RP"),
        ] {
            if self.contains(flag) {
                if !first {
                    f.write_str("|")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        if first {
            f.write_str("-")?;
        }
        Ok(())
    }
}

fn fmt_base(base: &BaseRepr, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    write!(f, "slot={} gen={}", base.path_slot, base.path_gen)
}

fn fmt_flags(base: &BaseRepr, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    if base.flags.known() != Flags::empty() {
        write!(f, " flags={}", base.flags.known())?;
    }
    Ok(())
}

impl fmt::Display for DataRepr {
    /// E.g. `DATA slot=3 gen=1 psn=17 qpn=5 msg=2 WRITE off=4096/65536 len=4096 rkey=0x7 addr=0x1000`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DATA ")?;
        fmt_base(&self.base, f)?;
        write!(
            f,
            " psn={} qpn={} msg={} {} off={}/{} len={}",
            self.psn,
            self.dst_qpn,
            self.msg_seq,
            self.opcode(),
            self.offset,
            self.msg_len,
            self.payload_len
        )?;
        match self.op {
            OpHeader::Write { rkey, remote_addr } | OpHeader::ReadRequest { rkey, remote_addr } => {
                write!(f, " rkey={rkey:#x} addr={remote_addr:#x}")?
            }
            OpHeader::WriteImm {
                rkey,
                remote_addr,
                recv_index,
                imm,
            } => write!(
                f,
                " rkey={rkey:#x} addr={remote_addr:#x} rq={recv_index} imm={imm:#x}"
            )?,
            OpHeader::Send { recv_index } => write!(f, " rq={recv_index}")?,
            OpHeader::SendImm { recv_index, imm } => write!(f, " rq={recv_index} imm={imm:#x}")?,
            OpHeader::ReadResponse => {}
            OpHeader::FetchAdd {
                rkey,
                remote_addr,
                add,
            } => write!(f, " rkey={rkey:#x} addr={remote_addr:#x} add={add:#x}")?,
            OpHeader::CmpSwap {
                rkey,
                remote_addr,
                compare,
                swap,
            } => write!(
                f,
                " rkey={rkey:#x} addr={remote_addr:#x} cmp={compare:#x} swap={swap:#x}"
            )?,
            OpHeader::AtomicResponse { original } => write!(f, " orig={original:#x}")?,
        }
        if self.solicited {
            f.write_str(" solicited")?;
        }
        fmt_flags(&self.base, f)?;
        write!(
            f,
            " ts={} port={}",
            self.timestamp_ns, self.base.src_device_port
        )
    }
}

impl fmt::Display for AckRepr {
    /// E.g. `ACK slot=3 gen=1 ack_psn=17 sack=2 rx=20 ce=0 ts_echo=5 delay=800ns rate=0 ops=[qpn=5 msn=3 ACK]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ACK ")?;
        fmt_base(&self.base, f)?;
        write!(
            f,
            " ack_psn={} sack={} rx={} ce={} ts_echo={} delay={}ns rate={}",
            self.ack_psn,
            self.sack.count(),
            self.rx_packets,
            self.ce_packets,
            self.ts_echo,
            self.ack_delay_ns,
            self.rate_hint_mbps
        )?;
        if let Some((first, count)) = self.trimmed() {
            write!(f, " trimmed={first}+{count}")?;
        }
        if !self.op_acks().is_empty() {
            f.write_str(" ops=[")?;
            for (index, op) in self.op_acks().iter().enumerate() {
                if index > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "qpn={} msn={} {}", op.qpn, op.msn, op.syndrome)?;
                if op.syndrome.is_nak() {
                    write!(f, "({})", op.nak_msg_seq)?;
                }
            }
            f.write_str("]")?;
        }
        fmt_flags(&self.base, f)?;
        write!(f, " port={}", self.base.src_device_port)
    }
}

impl fmt::Display for Packet<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Packet::Data { repr, .. } => repr.fmt(f),
            Packet::Ack(repr) => repr.fmt(f),
        }
    }
}
