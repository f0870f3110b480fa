//! CM MADs on the wire as a kernel CM sends them: each message in a UD SEND_ONLY to QP1 from
//! QP1 with the GSI Q_Key, written as `target/tmp/cm-mads.pcap` for tools nobody here wrote
//! (`scripts/check-vectors.sh` has tshark read every field back), and parsed back here.

use ferroce::drivers::pcap;
use ferroce::stack::wire::mad::{
    self, port_space, service_id, CmMad, CmMessage, CmPath, CmaHeader, Dreq, Ids, Mra, Rej, Rep,
    Req, SidrRep, SidrReq, CMA_HEADER_LEN, MAD_LEN,
};
use ferroce::stack::wire::sample::{sample_repr, SampleAddr};
use ferroce::stack::wire::{Checks, DethRepr, Opcode, Qpn, RoceRepr};

/// The frames of `cm-mads.pcap`, one per message kind, in the order check-vectors.sh lists.
pub fn cm_frames() -> Vec<Vec<u8>> {
    let mut cma = [0u8; CMA_HEADER_LEN];
    CmaHeader {
        src_port: 0xc123,
        src: "10.0.0.1".parse().unwrap(),
        dst: "10.0.0.2".parse().unwrap(),
    }
    .emit(&mut cma);
    let mut req_pd = cma.to_vec();
    req_pd.extend_from_slice(b"hello from rping");
    let gid = |last: u8| {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&[10, 0, 0, last]);
        g
    };
    let svc = service_id(port_space::TCP, 7174);
    let msgs = [
        CmMessage::Req(Req {
            local_comm_id: 0x1d2c_3b4a,
            vendor_id: 0,
            service_id: svc,
            local_ca_guid: 0x0200_00ff_fe00_0001,
            local_qkey: 0,
            local_qpn: 0x00_0102,
            responder_resources: 16,
            local_eecn: 0,
            initiator_depth: 16,
            remote_eecn: 0,
            remote_cm_response_timeout: 20,
            transport_service_type: 0,
            end_to_end_flow_control: true,
            starting_psn: 0x51_2a3b,
            local_cm_response_timeout: 20,
            retry_count: 7,
            pkey: 0xffff,
            path_mtu: 3,
            rdc_exists: false,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            srq: false,
            extended_transport_type: 0,
            primary: CmPath {
                local_lid: 0xffff,
                remote_lid: 0xffff,
                local_gid: gid(1),
                remote_gid: gid(2),
                flow_label: 0,
                packet_rate: 0,
                traffic_class: 0,
                hop_limit: 64,
                sl: 0,
                subnet_local: false,
                local_ack_timeout: 18,
            },
            alternate: CmPath::default(),
            sap_supported: false,
            private_data: &req_pd,
        }),
        CmMessage::Mra(Mra {
            local_comm_id: 0x7e6f_5a4b,
            remote_comm_id: 0x1d2c_3b4a,
            message_mraed: 0,
            service_timeout: 22,
            private_data: &[],
        }),
        CmMessage::Rep(Rep {
            local_comm_id: 0x7e6f_5a4b,
            remote_comm_id: 0x1d2c_3b4a,
            local_qkey: 0,
            local_qpn: 0x00_0203,
            vendor_id: 0,
            local_eecn: 0,
            starting_psn: 0x00_6e5f,
            responder_resources: 16,
            initiator_depth: 16,
            target_ack_delay: 15,
            failover_accepted: 0,
            end_to_end_flow_control: true,
            rnr_retry_count: 7,
            srq: false,
            local_ca_guid: 0x0200_00ff_fe00_0002,
            private_data: b"server data",
        }),
        CmMessage::Rtu(Ids {
            local_comm_id: 0x1d2c_3b4a,
            remote_comm_id: 0x7e6f_5a4b,
            private_data: &[],
        }),
        CmMessage::Dreq(Dreq {
            local_comm_id: 0x1d2c_3b4a,
            remote_comm_id: 0x7e6f_5a4b,
            remote_qpn: 0x00_0203,
            private_data: &[],
        }),
        CmMessage::Drep(Ids {
            local_comm_id: 0x7e6f_5a4b,
            remote_comm_id: 0x1d2c_3b4a,
            private_data: &[],
        }),
        CmMessage::Rej(Rej {
            local_comm_id: 0,
            remote_comm_id: 0x1d2c_3b4b,
            message_rejected: 0,
            reason: 8,
            ari: &[],
            private_data: &[],
        }),
        CmMessage::SidrReq(SidrReq {
            request_id: 0x0000_1234,
            pkey: 0xffff,
            service_id: service_id(port_space::UDP, 7174),
            private_data: &req_pd,
        }),
        CmMessage::SidrRep(SidrRep {
            request_id: 0x0000_1234,
            status: 0,
            vendor_id: 0,
            qpn: 0x00_0304,
            service_id: service_id(port_space::UDP, 7174),
            qkey: 0x0123_4567,
            info: &[],
            private_data: &[],
        }),
    ];
    msgs.iter()
        .enumerate()
        .map(|(i, &m)| {
            let mut mad_bytes = [0u8; MAD_LEN];
            CmMad::new(0x0000_0001_0000_0000 + i as u64, m)
                .emit(&mut mad_bytes)
                .unwrap();
            let mut r: RoceRepr = sample_repr(Opcode::UD_SEND_ONLY, SampleAddr::default(), MAD_LEN);
            r.bth.dest_qpn = Qpn::new(mad::GSI_QPN);
            r.bth.pkey = 0xffff;
            r.ext.deth = Some(DethRepr {
                qkey: mad::GSI_QKEY,
                src_qp: Qpn::new(mad::GSI_QPN),
            });
            let mut buf = vec![0u8; r.buffer_len()];
            let n = r.emit_with_payload(&mut buf, &mad_bytes).unwrap();
            buf.truncate(n);
            buf
        })
        .collect()
}

/// What tshark must read in each frame of `cm-mads.pcap`: its field names, and the values
/// ferroce meant (numbers, or the dotted addresses tshark prints for IPv4 GIDs).
fn expected() -> serde_json::Value {
    use serde_json::json;
    let mad = |tid: u64, attr: u16| {
        json!({
            "infiniband.bth.destqp": 1,
            "infiniband.deth.q_key": 0x8001_0000u64,
            "infiniband.deth.srcqp": 1,
            "infiniband.mad.baseversion": 1,
            "infiniband.mad.mgmtclass": 7,
            "infiniband.mad.classversion": 2,
            "infiniband.mad.method": 3,
            "infiniband.mad.transactionid": tid,
            "infiniband.mad.attributeid": attr,
        })
    };
    let with = |mut a: serde_json::Value, b: serde_json::Value| {
        a.as_object_mut()
            .unwrap()
            .extend(b.as_object().unwrap().clone());
        a
    };
    let t = 0x0000_0001_0000_0000u64;
    json!([
        with(
            mad(t, 0x10),
            json!({
                "infiniband.cm.req": 0x1d2c_3b4au32,
                "infiniband.cm.req.serviceid": 0x0106_1c06u64,
                "infiniband.cm.req.serviceid.dport": 7174,
                "infiniband.cm.req.localcaguid": 0x0200_00ff_fe00_0001u64,
                "infiniband.cm.req.localqpn": 0x102,
                "infiniband.cm.req.responderres": 16,
                "infiniband.cm.req.initdepth": 16,
                "infiniband.cm.req.remoteresptout": 20,
                "infiniband.cm.req.transpsvctype": 0,
                "infiniband.cm.req.e2eflowctrl": 1,
                "infiniband.cm.req.startpsn": 0x51_2a3b,
                "infiniband.cm.req.localresptout": 20,
                "infiniband.cm.req.retrcount": 7,
                "infiniband.cm.req.pkey": 0xffff,
                "infiniband.cm.req.pppmtu": 3,
                "infiniband.cm.req.rnrretrcount": 7,
                "infiniband.cm.req.maxcmretr": 15,
                "infiniband.cm.req.srq": 0,
                "infiniband.cm.req.prim_locallid": 0xffff,
                "infiniband.cm.req.prim_remotelid": 0xffff,
                "infiniband.cm.req.prim_localgid_ipv4": "10.0.0.1",
                "infiniband.cm.req.prim_remotegid_ipv4": "10.0.0.2",
                "infiniband.cm.req.prim_hoplim": 64,
                "infiniband.cm.req.prim_localacktout": 18,
                "infiniband.cm.req.ip_cm.ipv": 4,
                "infiniband.cm.req.ip_cm.sport": 0xc123,
                "infiniband.cm.req.ip_cm.sip4": "10.0.0.1",
                "infiniband.cm.req.ip_cm.dip4": "10.0.0.2",
            })
        ),
        // tshark 4.0 dissects no MRA, SIDR_REQ or SIDR_REP body: their headers only.
        mad(t + 1, 0x11),
        with(
            mad(t + 2, 0x13),
            json!({
                "infiniband.cm.rep": 0x7e6f_5a4bu32,
                "infiniband.cm.rep.remotecommid": 0x1d2c_3b4au32,
                "infiniband.cm.rep.localqpn": 0x203,
                "infiniband.cm.rep.startpsn": 0x6e5f,
                "infiniband.cm.rep.respres": 16,
                "infiniband.cm.rep.initdepth": 16,
                "infiniband.cm.rep.tgtackdelay": 15,
                "infiniband.cm.rep.e2eflowctrl": 1,
                "infiniband.cm.rep.rnrretrcount": 7,
                "infiniband.cm.rep.srq": 0,
                "infiniband.cm.rep.localcaguid": 0x0200_00ff_fe00_0002u64,
            })
        ),
        with(
            mad(t + 3, 0x14),
            json!({
                "infiniband.cm.rtu.localcommid": 0x1d2c_3b4au32,
                "infiniband.cm.rtu.remotecommid": 0x7e6f_5a4bu32,
            })
        ),
        // (tshark 4.0 reads no remote QPN in a DREQ.)
        with(
            mad(t + 4, 0x15),
            json!({
                "infiniband.cm.dreq.localcommid": 0x1d2c_3b4au32,
                "infiniband.cm.dreq.remotecommid": 0x7e6f_5a4bu32,
            })
        ),
        with(
            mad(t + 5, 0x16),
            json!({
                "infiniband.cm.drsp.localcommid": 0x7e6f_5a4bu32,
                "infiniband.cm.drsp.remotecommid": 0x1d2c_3b4au32,
            })
        ),
        with(
            mad(t + 6, 0x12),
            json!({
                "infiniband.cm.rej.localcommid": 0,
                "infiniband.cm.rej.remotecommid": 0x1d2c_3b4bu32,
                "infiniband.cm.rej.msgrej": 0,
                "infiniband.cm.rej.reason": 8,
            })
        ),
        mad(t + 7, 0x17),
        mad(t + 8, 0x18),
    ])
}

#[test]
fn cm_mads_on_qp1_parse_back_and_are_captured() {
    let frames = cm_frames();
    let names = [
        "REQ", "MRA", "REP", "RTU", "DREQ", "DREP", "REJ", "SIDR_REQ", "SIDR_REP",
    ];
    for (f, name) in frames.iter().zip(names) {
        let pkt = RoceRepr::parse(f, Checks::ALL).unwrap();
        assert_eq!(pkt.repr.bth.dest_qpn, Qpn::new(1));
        assert_eq!(pkt.repr.ext.deth.unwrap().qkey, mad::GSI_QKEY);
        let m = CmMad::parse(pkt.payload).unwrap();
        assert_eq!(m.msg.name(), name);
        if let CmMessage::Req(r) = m.msg {
            let h = CmaHeader::parse(r.private_data).unwrap();
            assert_eq!(h.src_port, 0xc123);
            assert_eq!(&r.private_data[36..52], b"hello from rping");
        }
    }
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::write(
        dir.join("cm-mads.expect.json"),
        serde_json::to_string_pretty(&expected()).unwrap(),
    )
    .unwrap();
    let mut w = pcap::writer(std::fs::File::create(dir.join("cm-mads.pcap")).unwrap()).unwrap();
    for (i, f) in frames.iter().enumerate() {
        w.write_packet(&pcap_file::pcap::PcapPacket::new(
            std::time::Duration::from_micros(i as u64),
            f.len() as u32,
            f,
        ))
        .unwrap();
    }
}
