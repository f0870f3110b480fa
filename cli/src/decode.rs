//! `ferroce decode FILE`: every frame of a capture as one JSON object per line, in order, then
//! `N decoded, M rejected`.
//!
//! Field names are stable (scripts and the tshark cross-check read them). `index` counts from
//! 1 as Wireshark numbers frames. 64-bit values (addresses, atomic operands) are hex strings,
//! since JSON numbers lose precision past 2^53 in most readers. A frame the stack rejects is
//! `{"index":N,"error":"<kind>: <detail>"}`; a frame whose only fault is its ICRC keeps its
//! fields as well, with `"icrc_ok":false` beside the error.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use ferroce_stack::wire::{Checks, IpRepr, RocePacket, RoceRepr, SackEthRepr};
use pcap_file::pcap::PcapReader;
use pcap_file::pcapng::{Block, PcapNgReader};
use pcap_file::DataLink;
use serde_json::{json, Map, Value};

use ferroce_reliability::sdr::ImmLayout;

use crate::Failure;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The capture: pcap (micro- or nanosecond) or pcapng, Ethernet link type.
    file: PathBuf,
    /// Print the summary as a JSON object instead of `N decoded, M rejected`.
    #[arg(long)]
    json: bool,
    /// Read every immediate as SDR's: `"sdr":{"msg_id","offset","user"}` beside `imm`, with
    /// the paper's 10 + 18 + 4 bit split, or `--sdr-layout`'s.
    #[arg(long)]
    sdr: bool,
    /// The SDR immediate's field widths, MSG,OFFSET,USER (adding up to 32); implies --sdr.
    #[arg(long, value_name = "MSG,OFFSET,USER")]
    sdr_layout: Option<String>,
}

/// The SDR layout `--sdr` / `--sdr-layout` ask for, if any.
fn sdr_layout(args: &Args) -> Result<Option<ImmLayout>, Failure> {
    let Some(text) = &args.sdr_layout else {
        return Ok(args.sdr.then_some(ImmLayout::PAPER));
    };
    let bad = || {
        Failure(format!(
            "--sdr-layout wants three widths adding up to 32, such as 10,18,4; got '{text}'"
        ))
    };
    let w: Vec<u8> = text
        .split(',')
        .map(|x| x.trim().parse().map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    let [m, o, u] = w[..] else { return Err(bad()) };
    ImmLayout::new(m, o, u)
        .map(Some)
        .map_err(|e| Failure(format!("--sdr-layout: {e}")))
}

pub(crate) fn run(args: &Args) -> Result<ExitCode, Failure> {
    let file = File::open(&args.file)
        .map_err(|e| Failure(format!("cannot open {}: {e}", args.file.display())))?;
    let mut input = BufReader::new(file);
    let mut magic = [0u8; 4];
    input.read_exact(&mut magic).map_err(|_| {
        Failure(format!(
            "{} is not a pcap file (too short)",
            args.file.display()
        ))
    })?;
    let reader = std::io::Cursor::new(magic).chain(input);
    let out = std::io::stdout();
    let mut out = BufWriter::new(out.lock());
    let mut tally = Tally {
        sdr: sdr_layout(args)?,
        ..Tally::default()
    };
    let unreadable = |e: pcap_file::PcapError| {
        Failure(format!("{} could not be read: {e}", args.file.display()))
    };
    if magic == [0x0a, 0x0d, 0x0d, 0x0a] {
        let mut r = PcapNgReader::new(reader).map_err(unreadable)?;
        let mut links = Vec::new();
        while let Some(block) = r.next_block() {
            match block.map_err(unreadable)? {
                Block::InterfaceDescription(i) => links.push(i.linktype),
                Block::EnhancedPacket(p) => {
                    let link = links.get(p.interface_id as usize).copied();
                    tally.frame(&mut out, &p.data, link)?;
                }
                Block::SimplePacket(p) => tally.frame(&mut out, &p.data, links.first().copied())?,
                _ => {}
            }
        }
    } else {
        let mut r = PcapReader::new(reader).map_err(|e| {
            Failure(format!(
                "{} is not a pcap or pcapng file: {e}",
                args.file.display()
            ))
        })?;
        let link = r.header().datalink;
        while let Some(p) = r.next_packet() {
            let p = p.map_err(unreadable)?;
            tally.frame(&mut out, &p.data, Some(link))?;
        }
    }
    if args.json {
        writeln!(
            out,
            "{}",
            json!({"decoded": tally.decoded, "rejected": tally.rejected})
        )?;
    } else {
        writeln!(
            out,
            "{} decoded, {} rejected",
            tally.decoded, tally.rejected
        )?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

#[derive(Default)]
struct Tally {
    index: u64,
    decoded: u64,
    rejected: u64,
    /// Read immediates as SDR's, with this layout.
    sdr: Option<ImmLayout>,
}

impl Tally {
    fn frame(
        &mut self,
        out: &mut impl Write,
        data: &[u8],
        link: Option<DataLink>,
    ) -> Result<(), Failure> {
        self.index += 1;
        let obj = if link != Some(DataLink::ETHERNET) {
            error_object(self.index, "not_ethernet", &format!("link type {link:?}"))
        } else {
            match RoceRepr::parse(
                data,
                Checks {
                    icrc: false,
                    ..Checks::ALL
                },
            ) {
                Ok(p) => {
                    let mut obj = frame_object(self.index, &p);
                    if let (Some(l), Some(i)) = (self.sdr, p.repr.ext.imm_dt) {
                        let f = l.unpack(i.imm);
                        obj.insert(
                            "sdr".into(),
                            json!({"msg_id": f.msg_id, "offset": f.offset, "user": f.user}),
                        );
                    }
                    if let Err(e) = p.icrc_check() {
                        obj.insert("error".into(), format!("{}: {e}", e.kind()).into());
                    }
                    obj
                }
                Err(e) => error_object(self.index, e.kind(), &e.to_string()),
            }
        };
        if obj.contains_key("error") {
            self.rejected += 1;
        } else {
            self.decoded += 1;
        }
        writeln!(out, "{}", Value::Object(obj))?;
        Ok(())
    }
}

fn error_object(index: u64, kind: &str, detail: &str) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("index".into(), index.into());
    m.insert("error".into(), format!("{kind}: {detail}").into());
    m
}

fn hex64(v: u64) -> Value {
    format!("{v:#018x}").into()
}

/// The JSON object of a frame that parsed.
pub(crate) fn frame_object(index: u64, p: &RocePacket<'_>) -> Map<String, Value> {
    let r = &p.repr;
    let mut m = Map::new();
    let mut put = |k: &str, v: Value| {
        m.insert(k.to_owned(), v);
    };
    put("index", index.into());
    if let Some(tag) = r.eth.vlan {
        put("vlan_id", tag.vid.into());
        put("vlan_pcp", tag.pcp.into());
    }
    put("ip_version", r.ip.version().into());
    match &r.ip {
        IpRepr::V4(ip) => {
            put("src_ip", ip.src.to_string().into());
            put("dst_ip", ip.dst.to_string().into());
            put("dscp", ip.dscp.into());
            put("ttl", ip.ttl.into());
        }
        IpRepr::V6(ip) => {
            put("src_ip", ip.src.to_string().into());
            put("dst_ip", ip.dst.to_string().into());
            put("dscp", ip.dscp.into());
            put("flow_label", ip.flow_label.into());
            put("hop_limit", ip.hop_limit.into());
        }
    }
    put("ecn", r.ip.ecn().bits().into());
    put("udp_sport", r.udp_src_port.into());
    let b = &r.bth;
    put("opcode", b.opcode.0.into());
    put("opcode_name", b.opcode.name().into());
    put("solicited", b.solicited.into());
    put("mig_req", b.mig_req.into());
    put("pad", b.pad_count.into());
    put("pkey", b.pkey.into());
    put("fecn", b.fecn.into());
    put("becn", b.becn.into());
    put("dest_qpn", b.dest_qpn.value().into());
    put("ack_req", b.ack_req.into());
    put("psn", b.psn.value().into());
    let e = &r.ext;
    if let Some(d) = e.deth {
        put("deth_qkey", d.qkey.into());
        put("deth_src_qp", d.src_qp.value().into());
    }
    if let Some(h) = e.reth {
        put("reth_va", hex64(h.va));
        put("reth_rkey", h.rkey.into());
        put("reth_len", h.dma_len.into());
    }
    if let Some(a) = e.atomic_eth {
        put("atomic_va", hex64(a.va));
        put("atomic_rkey", a.rkey.into());
        put("atomic_swap_add", hex64(a.swap_add));
        put("atomic_compare", hex64(a.compare));
    }
    if let Some(a) = e.aeth {
        put("aeth_syndrome", a.syndrome.into());
        put("aeth_msn", a.msn.value().into());
    }
    if let Some(a) = e.atomic_ack_eth {
        put("atomic_orig_data", hex64(a.orig_data));
    }
    if let Some(i) = e.imm_dt {
        put("imm", i.imm.into());
    }
    if let Some(i) = e.ieth {
        put("ieth_rkey", i.rkey.into());
    }
    if let Some(s) = e.sack_eth {
        // ferroce's selective acknowledgement: the expected PSN, the PSNs after it that
        // arrived, and what the responder reports lost or asks to avoid.
        put("sack_base", s.base.value().into());
        let arrived: Vec<u32> = (0..SackEthRepr::SPAN)
            .filter(|&i| s.has(i))
            .map(|i| s.base.add(1 + i).value())
            .collect();
        put("sack_arrived", arrived.into());
        if s.flags & SackEthRepr::LOST != 0 {
            put("sack_lost", s.lost.value().into());
        }
        if s.flags & SackEthRepr::AVOID != 0 {
            put("sack_avoid_path", s.path.into());
        }
    }
    put("payload_len", p.payload.len().into());
    // The trailer's bytes in wire order, as Wireshark shows the field.
    put("icrc", format!("{:#010x}", p.icrc.swap_bytes()).into());
    put("icrc_ok", p.icrc_check().is_ok().into());
    m
}
