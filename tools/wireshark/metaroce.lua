-- Wireshark dissector for MetaRoCE wire format version 1.
--
-- The format is specified in docs/spec/wire.md of the MetaRoCE repository;
-- every field of that document has a filter name under "metaroce." here,
-- and section numbers in the comments below refer to it.
--
-- Use:
--   wireshark -X lua_script:tools/wireshark/metaroce.lua capture.pcap
--   tshark    -X lua_script:tools/wireshark/metaroce.lua -r capture.pcap -V
-- or copy this file into Wireshark's personal Lua plugins folder
-- (Help > About Wireshark > Folders).
--
-- Registration:
--   * UDP port 4793, MetaRoCE's default device port (changeable under
--     Preferences > Protocols > MetaRoCE, or -o metaroce.udp_port:N);
--   * a heuristic dissector on every UDP port, which claims a datagram
--     only if it is a structurally valid MetaRoCE v1 packet (version byte,
--     packet type, reserved flag bits, exact lengths) and, unless it is
--     authenticated, its ICRC matches. This is how packets on IANA's
--     RoCEv2 port 4791 (which older MetaRoCE builds used) are found:
--     Wireshark gives 4791 to its InfiniBand dissector, so enable
--     "Try heuristic sub-dissectors first" in the UDP preferences
--     (-o udp.try_heuristic_first:TRUE) to decode them as MetaRoCE.
--
-- Tested with Wireshark 4.0 (Lua 5.2); the bit operations and CRC also
-- run under Lua 5.4, which newer Wireshark releases embed.

local metaroce = Proto("metaroce", "MetaRoCE")

local DEFAULT_UDP_PORT = 4793

-- Sizes (wire.md sections 3, 4.1, 5, 7, 7.1).
local BASE_LEN = 8
local DATA_HEADER_LEN = 36
local ACK_FIXED_LEN = 68
local SACK_LEN = 32
local OP_ACK_LEN = 16
local MAX_OP_ACKS = 16
local ICRC_LEN = 4
local AUTH_TRAILER_LEN = 24
local SACK_BITS = 256

local VERSION = 1
local TYPE_DATA = 1
local TYPE_ACK = 2

local FLAG_ACK_REQUEST = 0x01
local FLAG_RETRANSMIT = 0x02
local FLAG_COMPLETION_PROBE = 0x04
local FLAG_AUTHENTICATED = 0x08
local FLAG_ICRC_OMITTED = 0x10
local FLAG_SENDER_DRAINED = 0x20
local FLAG_REPAIR = 0x40
local FLAG_SACK_ABSENT = 0x80

local packet_types = { [TYPE_DATA] = "Data", [TYPE_ACK] = "Ack" }

-- Section 4.2: value -> name, extension length, whether it carries payload.
local opcodes = {
    [0] = { name = "WRITE", ext = 16, payload = true },
    [1] = { name = "WRITE_IMM", ext = 24, payload = true },
    [2] = { name = "SEND", ext = 4, payload = true },
    [3] = { name = "SEND_IMM", ext = 8, payload = true },
    [4] = { name = "READ_REQUEST", ext = 16, payload = false },
    [5] = { name = "READ_RESPONSE", ext = 0, payload = true },
    [6] = { name = "FETCH_ADD", ext = 24, payload = false, atomic = true },
    [7] = { name = "CMP_SWAP", ext = 32, payload = false, atomic = true },
    [8] = { name = "ATOMIC_RESPONSE", ext = 8, payload = false, atomic = true },
}
local opcode_names = {}
for value, op in pairs(opcodes) do opcode_names[value] = op.name end

-- Section 5.2.
local syndromes = {
    [0] = "ACK",
    [1] = "RNR_NAK",
    [2] = "REM_ACCESS_ERR",
    [3] = "REM_INV_REQ_ERR",
    [4] = "REM_OP_ERR",
}

local icrc_status_names = { [0] = "Unverified", [1] = "Good", [2] = "Bad" }
local ICRC_UNVERIFIED, ICRC_GOOD, ICRC_BAD = 0, 1, 2

-- ------------------------------------------------------------ fields

local f = {
    -- Section 3: base header.
    version = ProtoField.uint8("metaroce.version", "Version", base.DEC),
    packet_type = ProtoField.uint8("metaroce.packet_type", "Packet type", base.DEC, packet_types),
    flags = ProtoField.uint8("metaroce.flags", "Flags", base.HEX),
    flag_ack_request = ProtoField.bool("metaroce.flags.ack_request", "ACK request", 8,
        nil, FLAG_ACK_REQUEST, "The sender asks for an immediate ACK"),
    flag_retransmit = ProtoField.bool("metaroce.flags.retransmit", "Retransmit", 8,
        nil, FLAG_RETRANSMIT, "This packet resends a segment sent before"),
    flag_completion_probe = ProtoField.bool("metaroce.flags.completion_probe", "Completion probe", 8,
        nil, FLAG_COMPLETION_PROBE, "Every segment was acknowledged but no completion came"),
    flag_authenticated = ProtoField.bool("metaroce.flags.authenticated", "Authenticated", 8,
        nil, FLAG_AUTHENTICATED, "The packet ends with the authentication trailer, not the ICRC"),
    flag_icrc_omitted = ProtoField.bool("metaroce.flags.icrc_omitted", "ICRC omitted", 8,
        nil, FLAG_ICRC_OMITTED, "The ICRC trailer was not computed (sent as zero), by agreement"),
    flag_sender_drained = ProtoField.bool("metaroce.flags.sender_drained", "Sender drained", 8,
        nil, FLAG_SENDER_DRAINED, "The sender has no more new data queued toward this device"),
    flag_repair = ProtoField.bool("metaroce.flags.repair", "Repair", 8,
        nil, FLAG_REPAIR, "A repair packet: a recovery shard of the message's data packets, not message bytes"),
    flag_sack_absent = ProtoField.bool("metaroce.flags.sack_absent", "SACK absent", 8,
        nil, FLAG_SACK_ABSENT, "ACK packets: no SACK bitmap (all zero); the fields after it move up 32 bytes"),
    path_slot = ProtoField.uint8("metaroce.path_slot", "Path slot", base.DEC),
    path_gen = ProtoField.uint16("metaroce.path_gen", "Path generation", base.DEC),
    src_device_port = ProtoField.uint16("metaroce.src_device_port", "Source device port", base.DEC),

    -- Section 4.1: data header.
    psn = ProtoField.uint32("metaroce.psn", "PSN", base.DEC),
    timestamp_ns = ProtoField.uint32("metaroce.timestamp_ns", "Timestamp (ns)", base.DEC),
    dst_qpn = ProtoField.uint32("metaroce.dst_qpn", "Destination QPN", base.DEC_HEX),
    msg_seq = ProtoField.uint32("metaroce.msg_seq", "Message sequence", base.DEC),
    opcode = ProtoField.uint8("metaroce.opcode", "Opcode", base.DEC, opcode_names),
    op_flags = ProtoField.uint8("metaroce.op_flags", "Operation flags", base.HEX),
    op_flag_solicited = ProtoField.bool("metaroce.op_flags.solicited", "Solicited", 8, nil, 0x01),
    op_flag_floor_acked = ProtoField.bool("metaroce.op_flags.floor_acked", "Floor acked", 8, nil, 0x02),
    op_flag_reserved = ProtoField.uint8("metaroce.op_flags.reserved", "Reserved", base.HEX, nil, 0xfc),
    psn_floor_delta = ProtoField.uint16("metaroce.psn_floor_delta", "PSN floor delta", base.DEC),
    psn_floor = ProtoField.uint32("metaroce.psn_floor", "PSN floor", base.DEC, nil, nil,
        "psn - psn_floor_delta: no acknowledgement is expected below it"),
    msg_len = ProtoField.uint32("metaroce.msg_len", "Message length", base.DEC),
    offset = ProtoField.uint32("metaroce.offset", "Offset", base.DEC),
    -- Section 4.4: a repair packet's offset names its recovery shard,
    -- 1 << 31 | count << 16 | index.
    repair_count = ProtoField.uint16("metaroce.repair_count", "Repair count", base.DEC, nil, 0x7fff,
        "How many recovery shards the sender computed for the message"),
    repair_index = ProtoField.uint16("metaroce.repair_index", "Repair index", base.DEC, nil, nil,
        "Which recovery shard this packet carries, below the repair count"),

    -- Section 4.2: opcode extension headers.
    ext = ProtoField.bytes("metaroce.ext", "Extension header"),
    rkey = ProtoField.uint64("metaroce.rkey", "Remote key", base.HEX),
    remote_addr = ProtoField.uint64("metaroce.remote_addr", "Remote address", base.HEX),
    recv_index = ProtoField.uint32("metaroce.recv_index", "Receive index", base.DEC),
    imm = ProtoField.uint32("metaroce.imm", "Immediate", base.HEX),
    add = ProtoField.uint64("metaroce.add", "Add", base.HEX),
    compare = ProtoField.uint64("metaroce.compare", "Compare", base.HEX),
    swap = ProtoField.uint64("metaroce.swap", "Swap", base.HEX),
    original = ProtoField.uint64("metaroce.original", "Original", base.HEX),
    payload = ProtoField.bytes("metaroce.payload", "Payload"),
    payload_len = ProtoField.uint32("metaroce.payload_len", "Payload length", base.DEC),

    -- Section 5: ACK.
    ack_psn = ProtoField.uint32("metaroce.ack_psn", "Cumulative ACK PSN", base.DEC, nil, nil,
        "Every PSN before this one was received; this one was not"),
    ts_echo = ProtoField.uint32("metaroce.ts_echo", "Timestamp echo", base.DEC),
    ack_delay_ns = ProtoField.uint32("metaroce.ack_delay_ns", "ACK delay (ns)", base.DEC),
    rx_packets = ProtoField.uint32("metaroce.rx_packets", "Received packets", base.DEC),
    ce_packets = ProtoField.uint32("metaroce.ce_packets", "CE-marked packets", base.DEC),
    rate_hint_mbps = ProtoField.uint32("metaroce.rate_hint_mbps", "Rate hint (Mbit/s)", base.DEC),
    sack = ProtoField.bytes("metaroce.sack", "SACK bitmap"),
    sack_base = ProtoField.uint32("metaroce.sack.base", "SACK base PSN", base.DEC, nil, nil,
        "The PSN bit 0 stands for: ack_psn + 1"),
    sack_bit = ProtoField.uint16("metaroce.sack.bit", "SACK bit", base.DEC),
    sack_psn = ProtoField.uint32("metaroce.sack.psn", "SACKed PSN", base.DEC),
    sack_count = ProtoField.uint16("metaroce.sack.count", "SACK bits set", base.DEC),
    op_ack_count = ProtoField.uint8("metaroce.op_ack_count", "Op-ack count", base.DEC),
    trim_count = ProtoField.uint8("metaroce.trim_count", "Trimmed packets", base.DEC, nil, nil,
        "Packets of this path a switch cut to their headers: a NACK, resend them now"),
    trim_offset = ProtoField.uint16("metaroce.trim_offset", "Trimmed run offset", base.DEC, nil, nil,
        "The first trimmed PSN is ack_psn + this"),
    trim_psn = ProtoField.uint32("metaroce.trim_psn", "First trimmed PSN", base.DEC),

    -- Section 5.1: op-ack entries.
    op_ack = ProtoField.none("metaroce.op_ack", "Op-ack"),
    op_ack_qpn = ProtoField.uint32("metaroce.op_ack.qpn", "QPN", base.DEC_HEX),
    op_ack_msn = ProtoField.uint32("metaroce.op_ack.msn", "MSN", base.DEC),
    op_ack_syndrome = ProtoField.uint8("metaroce.op_ack.syndrome", "Syndrome", base.DEC, syndromes),
    op_ack_reserved = ProtoField.bytes("metaroce.op_ack.reserved", "Reserved"),
    op_ack_nak_msg_seq = ProtoField.uint32("metaroce.op_ack.nak_msg_seq", "NAK message sequence", base.DEC),

    -- Section 7: ICRC; 7.1: authentication trailer.
    icrc = ProtoField.uint32("metaroce.icrc", "ICRC", base.HEX),
    icrc_status = ProtoField.uint8("metaroce.icrc.status", "ICRC status", base.DEC, icrc_status_names),
    packet_number = ProtoField.uint64("metaroce.packet_number", "Packet number", base.DEC),
    auth_trailer = ProtoField.none("metaroce.auth_trailer", "Authentication trailer"),
    tag = ProtoField.bytes("metaroce.tag", "Authentication tag"),

    -- Anything the version byte does not let us read (section 9).
    undecoded = ProtoField.bytes("metaroce.undecoded", "Undecoded"),
}

local field_list = {}
for _, field in pairs(f) do field_list[#field_list + 1] = field end
metaroce.fields = field_list

-- ------------------------------------------------------------ expert info

local e = {
    truncated = ProtoExpert.new("metaroce.truncated", "Truncated MetaRoCE packet",
        expert.group.MALFORMED, expert.severity.ERROR),
    too_long = ProtoExpert.new("metaroce.too_long", "ACK longer than its op-ack count allows",
        expert.group.MALFORMED, expert.severity.ERROR),
    bad_version = ProtoExpert.new("metaroce.bad_version", "Unsupported MetaRoCE version",
        expert.group.MALFORMED, expert.severity.ERROR),
    bad_type = ProtoExpert.new("metaroce.bad_type", "Unknown packet type",
        expert.group.MALFORMED, expert.severity.ERROR),
    bad_opcode = ProtoExpert.new("metaroce.bad_opcode", "Unknown opcode",
        expert.group.MALFORMED, expert.severity.ERROR),
    bad_syndrome = ProtoExpert.new("metaroce.bad_syndrome", "Unknown syndrome",
        expert.group.MALFORMED, expert.severity.ERROR),
    too_many_op_acks = ProtoExpert.new("metaroce.too_many_op_acks", "More than 16 op-acks",
        expert.group.MALFORMED, expert.severity.ERROR),
    field_rule = ProtoExpert.new("metaroce.field_rule", "Field rule violated (receivers drop this as Malformed)",
        expert.group.MALFORMED, expert.severity.ERROR),
    bad_icrc = ProtoExpert.new("metaroce.icrc.bad", "Bad ICRC",
        expert.group.CHECKSUM, expert.severity.ERROR),
    reserved = ProtoExpert.new("metaroce.reserved_set", "Reserved bits set (ignored by receivers)",
        expert.group.PROTOCOL, expert.severity.NOTE),
    empty_sack = ProtoExpert.new("metaroce.sack.empty_present",
        "SACK bitmap present with no bit set (receivers drop this as Malformed: send it absent)",
        expert.group.MALFORMED, expert.severity.ERROR),
    nak = ProtoExpert.new("metaroce.nak", "Negative acknowledgement",
        expert.group.RESPONSE_CODE, expert.severity.NOTE),
    retransmit = ProtoExpert.new("metaroce.retransmission", "Retransmitted segment",
        expert.group.SEQUENCE, expert.severity.CHAT),
    snapped = ProtoExpert.new("metaroce.snapped", "Packet cut by the capture's snap length",
        expert.group.UNDECODED, expert.severity.NOTE),
}
local expert_list = {}
for _, ef in pairs(e) do expert_list[#expert_list + 1] = ef end
metaroce.experts = expert_list

-- ------------------------------------------------------------ preferences

metaroce.prefs.udp_port = Pref.uint("UDP port", DEFAULT_UDP_PORT,
    "MetaRoCE device port to decode (the heuristic finds packets on other ports)")
metaroce.prefs.check_icrc = Pref.bool("Verify ICRC", true,
    "Compute the CRC-32C of each packet and compare it with the ICRC trailer")

-- ------------------------------------------------------------ CRC-32C

-- Bit operations: Lua 5.3+ has native operators, Lua 5.2 has bit32, and
-- Wireshark also ships LuaBitOp as "bit". Native operators are compiled
-- from a string so that this file still parses under Lua 5.2.
local band, bxor, rshift
if bit32 then
    band, bxor, rshift = bit32.band, bit32.bxor, bit32.rshift
else
    local native = load([[return
        function(a, b) return a & b end,
        function(a, b) return a ~ b end,
        function(a, n) return (a & 0xffffffff) >> n end]])
    if native then
        band, bxor, rshift = native()
    else
        -- LuaBitOp returns signed results; fold them back to 0 .. 2^32-1.
        band = function(a, b) return bit.band(a, b) % 4294967296 end
        bxor = function(a, b) return bit.bxor(a, b) % 4294967296 end
        rshift = function(a, n) return bit.rshift(a, n) % 4294967296 end
    end
end

-- Reflected CRC-32C (Castagnoli), polynomial 0x82f63b78 (section 7).
local crc_table = {}
for i = 0, 255 do
    local c = i
    for _ = 1, 8 do
        if band(c, 1) == 1 then
            c = bxor(rshift(c, 1), 0x82f63b78)
        else
            c = rshift(c, 1)
        end
    end
    crc_table[i] = c
end

local function crc32c(bytes, first, last)
    local c = 0xffffffff
    for i = first, last do
        c = bxor(crc_table[band(bxor(c, bytes:get_index(i)), 0xff)], rshift(c, 8))
    end
    return bxor(c, 0xffffffff)
end

-- ------------------------------------------------------------ helpers

local function u8(tvb, at) return tvb(at, 1):uint() end
local function u16(tvb, at) return tvb(at, 2):uint() end
local function u32(tvb, at) return tvb(at, 4):uint() end

-- Section 5: an ACK without SACK bitmap (SACK_ABSENT) is 32 bytes shorter
-- before its op-ack entries, and its op-ack count is at 32, not 64.
local function ack_fixed_len(flags)
    if band(flags, FLAG_SACK_ABSENT) ~= 0 then return ACK_FIXED_LEN - SACK_LEN end
    return ACK_FIXED_LEN
end

local function trailer_len_of(flags)
    if band(flags, FLAG_AUTHENTICATED) ~= 0 then return AUTH_TRAILER_LEN end
    return ICRC_LEN
end

-- Why a datagram is not a MetaRoCE v1 packet, or nil: the structural
-- receiver checks of section 8, steps 1 to 3, in their order. Needs the
-- whole datagram captured. Also returns the header length (everything
-- before payload and trailer) of an acceptable packet.
local function structure_error(tvb, len)
    if len < 1 then return "truncated" end
    if u8(tvb, 0) ~= VERSION then return "bad_version" end
    if len < BASE_LEN then return "truncated" end
    local packet_type = u8(tvb, 1)
    local trailer = trailer_len_of(u8(tvb, 2))
    if packet_type == TYPE_DATA then
        if len < DATA_HEADER_LEN then return "truncated" end
        local op = opcodes[u8(tvb, 24)]
        if not op then return "bad_opcode" end
        local header_len = DATA_HEADER_LEN + op.ext
        if len < header_len + trailer then return "truncated" end
        return nil, header_len
    elseif packet_type == TYPE_ACK then
        local fixed = ack_fixed_len(u8(tvb, 2))
        if len < fixed then return "truncated" end
        local count = u8(tvb, fixed - 4)
        if count > MAX_OP_ACKS then return "too_many_op_acks" end
        local want = fixed + OP_ACK_LEN * count + trailer
        if len < want then return "truncated" end
        if len > want then return "too_long" end
        return nil, fixed + OP_ACK_LEN * count
    end
    return "bad_type"
end

local function icrc_matches(tvb, len)
    local bytes = tvb:bytes(0, len)
    return crc32c(bytes, 0, len - ICRC_LEN - 1) == u32(tvb, len - ICRC_LEN)
end

-- Section 7.2: the sender set ICRC_OMITTED and left the trailer zero.
local function icrc_omitted(tvb, len, flags)
    return band(flags, FLAG_ICRC_OMITTED) ~= 0 and u32(tvb, len - ICRC_LEN) == 0
end

-- ------------------------------------------------------------ dissection

local function add_base(tvb, tree)
    tree:add(f.version, tvb(0, 1))
    tree:add(f.packet_type, tvb(1, 1))
    local flags_item = tree:add(f.flags, tvb(2, 1))
    flags_item:add(f.flag_ack_request, tvb(2, 1))
    flags_item:add(f.flag_retransmit, tvb(2, 1))
    flags_item:add(f.flag_completion_probe, tvb(2, 1))
    flags_item:add(f.flag_authenticated, tvb(2, 1))
    flags_item:add(f.flag_icrc_omitted, tvb(2, 1))
    flags_item:add(f.flag_sender_drained, tvb(2, 1))
    flags_item:add(f.flag_repair, tvb(2, 1))
    flags_item:add(f.flag_sack_absent, tvb(2, 1))
    tree:add(f.path_slot, tvb(3, 1))
    tree:add(f.path_gen, tvb(4, 2))
    tree:add(f.src_device_port, tvb(6, 2))
end

local function flag_text(flags)
    local names = {}
    if band(flags, FLAG_ACK_REQUEST) ~= 0 then names[#names + 1] = "AR" end
    if band(flags, FLAG_RETRANSMIT) ~= 0 then names[#names + 1] = "RT" end
    if band(flags, FLAG_COMPLETION_PROBE) ~= 0 then names[#names + 1] = "CP" end
    if band(flags, FLAG_AUTHENTICATED) ~= 0 then names[#names + 1] = "AU" end
    if band(flags, FLAG_ICRC_OMITTED) ~= 0 then names[#names + 1] = "IO" end
    if band(flags, FLAG_SENDER_DRAINED) ~= 0 then names[#names + 1] = "SD" end
    if band(flags, FLAG_REPAIR) ~= 0 then names[#names + 1] = "RP" end
    if band(flags, FLAG_SACK_ABSENT) ~= 0 then names[#names + 1] = "NS" end
    if #names == 0 then return "" end
    return " flags=" .. table.concat(names, "|")
end

-- Section 4.2: the extension of `op` at `at`; returns text for the Info column.
local function add_extension(tvb, tree, op_value, at)
    local op = opcodes[op_value]
    if op.ext == 0 then return "" end
    local ext = tree:add(f.ext, tvb(at, op.ext))
    ext:set_text("Extension header (" .. op.name .. ", " .. op.ext .. " bytes)")
    local function hex64(o) return "0x" .. tvb(o, 8):uint64():tohex():gsub("^0+(%x)", "%1") end
    if op_value == 0 or op_value == 1 or op_value == 4 or op_value == 6 or op_value == 7 then
        ext:add(f.rkey, tvb(at, 8))
        ext:add(f.remote_addr, tvb(at + 8, 8))
        local text = " rkey=" .. hex64(at) .. " addr=" .. hex64(at + 8)
        if op_value == 1 then
            ext:add(f.recv_index, tvb(at + 16, 4))
            ext:add(f.imm, tvb(at + 20, 4))
            text = text .. string.format(" rq=%d imm=0x%x", u32(tvb, at + 16), u32(tvb, at + 20))
        elseif op_value == 6 then
            ext:add(f.add, tvb(at + 16, 8))
            text = text .. " add=" .. hex64(at + 16)
        elseif op_value == 7 then
            ext:add(f.compare, tvb(at + 16, 8))
            ext:add(f.swap, tvb(at + 24, 8))
            text = text .. " cmp=" .. hex64(at + 16) .. " swap=" .. hex64(at + 24)
        end
        return text
    elseif op_value == 2 or op_value == 3 then
        ext:add(f.recv_index, tvb(at, 4))
        local text = string.format(" rq=%d", u32(tvb, at))
        if op_value == 3 then
            ext:add(f.imm, tvb(at + 4, 4))
            text = text .. string.format(" imm=0x%x", u32(tvb, at + 4))
        end
        return text
    elseif op_value == 8 then
        ext:add(f.original, tvb(at, 8))
        return " orig=" .. hex64(at)
    end
    return ""
end

local function dissect_data(tvb, pinfo, tree, len, header_len, trailer)
    tree:add(f.psn, tvb(8, 4))
    tree:add(f.timestamp_ns, tvb(12, 4))
    tree:add(f.dst_qpn, tvb(16, 4))
    tree:add(f.msg_seq, tvb(20, 4))
    local op_value = u8(tvb, 24)
    local op = opcodes[op_value]
    tree:add(f.opcode, tvb(24, 1))
    local op_flags = tree:add(f.op_flags, tvb(25, 1))
    op_flags:add(f.op_flag_solicited, tvb(25, 1))
    op_flags:add(f.op_flag_floor_acked, tvb(25, 1))
    op_flags:add(f.op_flag_reserved, tvb(25, 1))
    if band(u8(tvb, 25), 0xfc) ~= 0 then op_flags:add_proto_expert_info(e.reserved) end
    local psn = u32(tvb, 8)
    local floor_delta = u16(tvb, 26)
    tree:add(f.psn_floor_delta, tvb(26, 2))
    tree:add(f.psn_floor, tvb(26, 2), (psn - floor_delta) % 4294967296):set_generated()
    tree:add(f.msg_len, tvb(28, 4))
    local offset_item = tree:add(f.offset, tvb(32, 4))
    local repair = band(u8(tvb, 2), FLAG_REPAIR) ~= 0
    local repair_count, repair_index = band(u16(tvb, 32), 0x7fff), u16(tvb, 34)
    if repair then
        -- Section 4.4: a repair packet's payload is a recovery shard, not
        -- message bytes; its offset is the shard's id, 1 << 31 | count << 16
        -- | index (the top bit keeps it past the end of any message).
        offset_item:append_text(string.format(" (repair shard: index %d, count %d)",
            repair_index, repair_count))
        offset_item:add(f.repair_count, tvb(32, 2))
        offset_item:add(f.repair_index, tvb(34, 2))
    end
    local ext_text = add_extension(tvb, tree, op_value, DATA_HEADER_LEN)

    local payload_len = len - header_len - trailer
    tree:add(f.payload_len, tvb(header_len, 0), payload_len):set_generated()
    local captured = math.min(payload_len, tvb:len() - header_len)
    if captured > 0 then
        local item = tree:add(f.payload, tvb(header_len, captured))
        if captured < payload_len then
            item:append_text(string.format(" (%d of %d bytes captured)", captured, payload_len))
        end
    end

    -- Section 4.3: field rules (a receiver drops the packet as Malformed).
    local msg_len, offset = u32(tvb, 28), u32(tvb, 32)
    -- Rule 1 does not bind a repair packet, whose offset is no byte offset;
    -- the repair rules do instead.
    if not repair and offset + payload_len > msg_len then
        tree:add_proto_expert_info(e.field_rule, "offset + payload length exceeds msg_len (wire.md 4.3 rule 1)")
    end
    if not op.payload and payload_len ~= 0 then
        tree:add_proto_expert_info(e.field_rule, op.name .. " carries no payload (wire.md 4.3 rule 2)")
    end
    if op.atomic and (msg_len ~= 8 or offset ~= 0) then
        tree:add_proto_expert_info(e.field_rule, op.name .. " needs msg_len 8 and offset 0 (wire.md 4.3 rule 3)")
    end
    if repair then
        -- Repair packets replace rule 1: a recovery shard of a WRITE or
        -- SEND's payload (opcodes 0 to 3), named by a repair id with its top
        -- bit set and an index below the count. A shard is as long as one
        -- data packet, and even, so never longer than msg_len rounded up to
        -- even.
        if op_value > 3 then
            tree:add_proto_expert_info(e.field_rule, "repair packet on " .. op.name ..
                ": only WRITE, WRITE_IMM, SEND and SEND_IMM carry recovery shards (wire.md 4.3, repair packets)")
        end
        if offset < 2147483648 then
            tree:add_proto_expert_info(e.field_rule,
                "repair id without its top bit set (wire.md 4.3, repair packets)")
        end
        if repair_index >= repair_count then
            tree:add_proto_expert_info(e.field_rule, string.format(
                "repair index %d is not below repair count %d (wire.md 4.3, repair packets)",
                repair_index, repair_count))
        end
        if payload_len == 0 or payload_len % 2 ~= 0 or payload_len > msg_len + 1 then
            tree:add_proto_expert_info(e.field_rule, string.format("repair shard of %d bytes: must be "
                .. "even, non-empty and at most msg_len + 1 (wire.md 4.3, repair packets)", payload_len))
        end
    end
    if band(u8(tvb, 2), FLAG_RETRANSMIT) ~= 0 then
        tree:add_proto_expert_info(e.retransmit)
    end

    local position = string.format("off=%d/%d", offset, msg_len)
    if repair then
        position = string.format("REPAIR %d/%d msg_len=%d", repair_index, repair_count, msg_len)
    end
    local info = string.format("DATA slot=%d gen=%d psn=%d qpn=%d msg=%d %s %s len=%d%s",
        u8(tvb, 3), u16(tvb, 4), psn, u32(tvb, 16), u32(tvb, 20), op.name, position,
        payload_len, ext_text)
    if band(u8(tvb, 25), 0x01) ~= 0 then info = info .. " solicited" end
    return info .. flag_text(u8(tvb, 2))
end

-- The SACK bitmap at 32..64; returns how many bits are set and the first
-- eight PSNs they name.
local function add_sack(tvb, tree, ack_psn)
    local sack = tree:add(f.sack, tvb(32, SACK_LEN))
    sack:add(f.sack_base, tvb(32, SACK_LEN), (ack_psn + 1) % 4294967296):set_generated()
    local set = 0
    local psns = {}
    for byte = 0, SACK_LEN - 1 do
        local value = u8(tvb, 32 + byte)
        for bit_index = 0, 7 do
            if band(value, 2 ^ bit_index) ~= 0 then
                local i = byte * 8 + bit_index
                local sacked = (ack_psn + 1 + i) % 4294967296
                sack:add(f.sack_bit, tvb(32 + byte, 1), i):append_text(" (PSN " .. sacked .. ")")
                sack:add(f.sack_psn, tvb(32 + byte, 1), sacked):set_generated()
                set = set + 1
                if #psns < 8 then psns[#psns + 1] = tostring(sacked) end
            end
        end
    end
    sack:add(f.sack_count, tvb(32, SACK_LEN), set):set_generated()
    sack:append_text(string.format(" (%d of %d set)", set, SACK_BITS))
    if set == 0 then
        sack:add_proto_expert_info(e.empty_sack)
    end
    return set, psns
end

local function dissect_ack(tvb, pinfo, tree, len, header_len, trailer)
    local ack_psn = u32(tvb, 8)
    tree:add(f.ack_psn, tvb(8, 4))
    tree:add(f.ts_echo, tvb(12, 4))
    tree:add(f.ack_delay_ns, tvb(16, 4))
    tree:add(f.rx_packets, tvb(20, 4))
    tree:add(f.ce_packets, tvb(24, 4))
    tree:add(f.rate_hint_mbps, tvb(28, 4))

    -- Section 5: bit i (LSB first within each byte) = PSN ack_psn + 1 + i.
    -- Without it (SACK_ABSENT) the fields after it start at 32, not 64.
    local set = 0
    local psns = {}
    local tail = ACK_FIXED_LEN - SACK_LEN - 4
    if band(u8(tvb, 2), FLAG_SACK_ABSENT) == 0 then
        set, psns = add_sack(tvb, tree, ack_psn)
        tail = ACK_FIXED_LEN - 4
    end

    local count = u8(tvb, tail)
    tree:add(f.op_ack_count, tvb(tail, 1))
    local trimmed = u8(tvb, tail + 1)
    tree:add(f.trim_count, tvb(tail + 1, 1))
    tree:add(f.trim_offset, tvb(tail + 2, 2))
    if trimmed > 0 then
        tree:add(f.trim_psn, tvb(tail + 2, 2), (ack_psn + u16(tvb, tail + 2)) % 4294967296):set_generated()
    end

    local op_text = {}
    for n = 0, count - 1 do
        local at = tail + 4 + OP_ACK_LEN * n
        local entry = tree:add(f.op_ack, tvb(at, OP_ACK_LEN))
        entry:add(f.op_ack_qpn, tvb(at, 4))
        entry:add(f.op_ack_msn, tvb(at + 4, 4))
        local syndrome_item = entry:add(f.op_ack_syndrome, tvb(at + 8, 1))
        entry:add(f.op_ack_reserved, tvb(at + 9, 3))
        entry:add(f.op_ack_nak_msg_seq, tvb(at + 12, 4))
        if tvb(at + 9, 3):uint() ~= 0 then entry:add_proto_expert_info(e.reserved) end
        local syndrome = u8(tvb, at + 8)
        local name = syndromes[syndrome]
        if not name then
            syndrome_item:add_proto_expert_info(e.bad_syndrome, "Unknown syndrome " .. syndrome)
            name = "syndrome " .. syndrome
        elseif syndrome ~= 0 then
            syndrome_item:add_proto_expert_info(e.nak,
                string.format("%s for msg_seq %d on QP %d", name, u32(tvb, at + 12), u32(tvb, at)))
        end
        entry:set_text(string.format("Op-ack %d: QPN %d, MSN %d, %s%s", n, u32(tvb, at),
            u32(tvb, at + 4), name, syndrome ~= 0 and (", msg_seq " .. u32(tvb, at + 12)) or ""))
        op_text[#op_text + 1] = string.format("%d:%d:%s", u32(tvb, at), u32(tvb, at + 4), name)
    end

    local info = string.format("ACK slot=%d gen=%d ack_psn=%d sack=%d", u8(tvb, 3), u16(tvb, 4),
        ack_psn, set)
    if set > 0 then
        info = info .. " [" .. table.concat(psns, ",") .. (set > #psns and ",..." or "") .. "]"
    end
    info = info .. string.format(" rx=%d ce=%d ts_echo=%d delay=%dns rate=%d", u32(tvb, 20),
        u32(tvb, 24), u32(tvb, 12), u32(tvb, 16), u32(tvb, 28))
    if trimmed > 0 then
        info = info .. string.format(" trimmed=%d+%d", (ack_psn + u16(tvb, 66)) % 4294967296, trimmed)
    end
    if count > 0 then info = info .. " ops=" .. table.concat(op_text, ",") end
    return info .. flag_text(u8(tvb, 2))
end

local function dissect_trailer(tvb, tree, len, flags)
    if tvb:len() < len then
        -- Cut by the snap length (flagged above): nothing to verify.
        return ""
    end
    if band(flags, FLAG_AUTHENTICATED) ~= 0 then
        -- Section 7.1: verifying the tag needs the connection's key.
        local at = len - AUTH_TRAILER_LEN
        local trailer = tree:add(f.auth_trailer, tvb(at, AUTH_TRAILER_LEN))
        trailer:add(f.packet_number, tvb(at, 8))
        trailer:add(f.tag, tvb(at + 8, 16))
        return " pn=" .. tostring(tvb(at, 8):uint64())
    end
    local at = len - ICRC_LEN
    local item = tree:add(f.icrc, tvb(at, ICRC_LEN))
    local status = ICRC_UNVERIFIED
    if icrc_omitted(tvb, len, flags) then
        -- Section 7.2: a zero trailer under ICRC_OMITTED was never
        -- computed; a receiver that agreed to the omission skips it.
        item:append_text(" [omitted by agreement, not verified]")
    elseif metaroce.prefs.check_icrc then
        if icrc_matches(tvb, len) then
            status = ICRC_GOOD
            item:append_text(" [correct]")
        else
            status = ICRC_BAD
            local want = crc32c(tvb:bytes(0, len), 0, at - 1)
            item:append_text(string.format(" [incorrect, should be 0x%08x]", want))
            item:add_proto_expert_info(e.bad_icrc)
        end
    end
    tree:add(f.icrc_status, tvb(at, ICRC_LEN), status):set_generated()
    if status == ICRC_BAD then return " [BAD ICRC]" end
    return ""
end

-- Dissect what fits; report what does not. Returns the bytes consumed.
-- Section 5.3, coalescing: an ACK may be followed by more packets in its
-- datagram. Its own length is fixed by its flags, op-ack count and trailer; the
-- bytes after it are the next packet. Returns the first packet's length.
local function first_packet_len(tvb, len)
    if tvb:len() < BASE_LEN or u8(tvb, 0) ~= VERSION or u8(tvb, 1) ~= TYPE_ACK then
        return len
    end
    local fixed = ack_fixed_len(u8(tvb, 2))
    if tvb:len() < fixed then return len end
    local count = u8(tvb, fixed - 4)
    if count > 16 then return len end
    local n = fixed + OP_ACK_LEN * count + trailer_len_of(u8(tvb, 2))
    if n < len then return n end
    return len
end

local function dissect(tvb, pinfo, root)
    local len = tvb:reported_length_remaining()
    pinfo.cols.protocol = "MetaRoCE"
    local first = first_packet_len(tvb, len)
    if first < len then
        -- One packet after the other, each in a tree of its own.
        dissect(tvb(0, first):tvb(), pinfo, root)
        local info = tostring(pinfo.cols.info)
        dissect(tvb(first):tvb(), pinfo, root)
        pinfo.cols.info = info .. " + " .. tostring(pinfo.cols.info)
        return len
    end
    local tree = root:add(metaroce, tvb())

    if tvb:len() < len then
        -- Cut by the snap length: decode the headers that were captured.
        tree:add_proto_expert_info(e.snapped)
    end

    local problem, header_len = structure_error(tvb, math.min(len, tvb:len()))
    if problem and tvb:len() < len and problem == "truncated" then
        -- Not truncated on the wire, only in the capture: decode what we can.
        problem = nil
    end
    if problem == "bad_version" then
        tree:add(f.version, tvb(0, 1))
        tree:add_proto_expert_info(e.bad_version, "Unsupported version " .. u8(tvb, 0) ..
            " (this dissector knows version 1; receivers drop it, wire.md 8 step 1)")
        if len > 1 then tree:add(f.undecoded, tvb(1)) end
        pinfo.cols.info = "MetaRoCE version " .. u8(tvb, 0) .. " (unsupported)"
        return len
    end
    if problem == "truncated" and len < BASE_LEN then
        tree:add_proto_expert_info(e.truncated, "Datagram of " .. len .. " bytes, shorter than the base header")
        if len > 0 then tree:add(f.undecoded, tvb(0)) end
        pinfo.cols.info = "MetaRoCE truncated (" .. len .. " bytes)"
        return len
    end

    add_base(tvb, tree)
    local packet_type = u8(tvb, 1)
    local flags = u8(tvb, 2)
    local trailer = trailer_len_of(flags)
    if problem == "bad_type" then
        tree:add_proto_expert_info(e.bad_type, "Unknown packet type " .. packet_type)
        if len > BASE_LEN then tree:add(f.undecoded, tvb(BASE_LEN)) end
        pinfo.cols.info = "MetaRoCE unknown packet type " .. packet_type
        return len
    end

    if packet_type == TYPE_DATA then
        if problem == "bad_opcode" then
            tree:add_proto_expert_info(e.bad_opcode, "Unknown opcode " .. u8(tvb, 24))
            tree:add(f.undecoded, tvb(BASE_LEN))
            pinfo.cols.info = "MetaRoCE DATA with unknown opcode " .. u8(tvb, 24)
            return len
        end
        if problem == "truncated" then
            local need = DATA_HEADER_LEN
            if len >= DATA_HEADER_LEN and opcodes[u8(tvb, 24)] then
                need = DATA_HEADER_LEN + opcodes[u8(tvb, 24)].ext + trailer
            end
            tree:add_proto_expert_info(e.truncated, string.format(
                "Data packet of %d bytes; its headers and trailer need %d", len, need))
            tree:add(f.undecoded, tvb(BASE_LEN))
            pinfo.cols.info = "MetaRoCE DATA truncated"
            return len
        end
        if not header_len then
            -- Only reached for a capture cut short: lengths come from the
            -- reported length, accessors stop at the snap length.
            local op = opcodes[u8(tvb, 24)]
            if not op then
                tree:add_proto_expert_info(e.bad_opcode, "Unknown opcode " .. u8(tvb, 24))
                pinfo.cols.info = "MetaRoCE DATA with unknown opcode " .. u8(tvb, 24)
                return len
            end
            header_len = DATA_HEADER_LEN + op.ext
        end
        local info = dissect_data(tvb, pinfo, tree, len, header_len, trailer)
        pinfo.cols.info = info
        pinfo.cols.info = info .. dissect_trailer(tvb, tree, len, flags)
    else
        local fixed = ack_fixed_len(flags)
        if problem == "too_many_op_acks" then
            tree:add(f.op_ack_count, tvb(fixed - 4, 1))
            tree:add_proto_expert_info(e.too_many_op_acks, u8(tvb, fixed - 4) .. " op-acks, at most 16 allowed")
            pinfo.cols.info = "MetaRoCE ACK malformed (op_ack_count)"
            return len
        end
        if problem == "truncated" or problem == "too_long" then
            local want = fixed + trailer
            if len >= fixed then want = want + OP_ACK_LEN * u8(tvb, fixed - 4) end
            local ef = problem == "truncated" and e.truncated or e.too_long
            tree:add_proto_expert_info(ef, string.format(
                "ACK of %d bytes; wire.md 5 requires exactly %d", len, want))
            tree:add(f.undecoded, tvb(BASE_LEN))
            pinfo.cols.info = "MetaRoCE ACK " .. (problem == "truncated" and "truncated" or "too long")
            return len
        end
        header_len = header_len or fixed + OP_ACK_LEN * u8(tvb, fixed - 4)
        local info = dissect_ack(tvb, pinfo, tree, len, header_len, trailer)
        pinfo.cols.info = info
        pinfo.cols.info = info .. dissect_trailer(tvb, tree, len, flags)
    end
    return len
end

function metaroce.dissector(tvb, pinfo, tree)
    return dissect(tvb, pinfo, tree)
end

-- The heuristic claims only what a MetaRoCE v1 receiver would accept at
-- the structural level, and (unauthenticated packets) whose ICRC matches
-- or was omitted (ICRC_OMITTED with a zero trailer, section 7.2):
-- random UDP traffic passes these by chance about once in 2^40.
local function heuristic(tvb, pinfo, tree)
    local len = tvb:len()
    if len ~= tvb:reported_length_remaining() or len < BASE_LEN then return false end
    if u8(tvb, 0) ~= VERSION then return false end
    local flags = u8(tvb, 2)
    -- SACK_ABSENT is a layout bit of ACKs: on a data packet it is what
    -- the reserved bits were, a sign of something else.
    if band(flags, FLAG_SACK_ABSENT) ~= 0 and u8(tvb, 1) ~= TYPE_ACK then return false end
    -- The first packet decides (a coalesced datagram, section 5.3, starts
    -- with an ACK of its own length).
    local first = first_packet_len(tvb, len)
    local head = tvb
    if first < len then head = tvb(0, first):tvb() end
    if structure_error(head, first) then return false end
    if band(flags, FLAG_AUTHENTICATED) == 0 and not icrc_omitted(head, first, flags)
        and not icrc_matches(head, first) then
        return false
    end
    dissect(tvb, pinfo, tree)
    return true
end

metaroce:register_heuristic("udp", heuristic)

local registered_port = nil
local function register_port()
    local udp_table = DissectorTable.get("udp.port")
    if registered_port then udp_table:remove(registered_port, metaroce) end
    registered_port = metaroce.prefs.udp_port
    if registered_port ~= 0 then udp_table:add(registered_port, metaroce) end
end

function metaroce.prefs_changed()
    if registered_port ~= metaroce.prefs.udp_port then register_port() end
end

register_port()
