//! The communication manager (IBTA Vol 1 chapter 12), sans-IO: one port's agent on QP1. It
//! is fed CM MADs (with the peer they came from) and time, and asked for MADs to send,
//! events for the consumer, and its next deadline, as a transport QP is. The consumer (the
//! verbs layer, or librdmacm through it) listens on service IDs, connects, accepts, rejects,
//! disconnects; the agent runs the REQ / REP / RTU and DREQ / DREP exchanges, resends what
//! goes unanswered within the CM response timeout up to the retry count, answers duplicates
//! as chapter 12 asks (a duplicate REQ gets its REP again, or an MRA while the consumer
//! decides; a duplicate DREQ its DREP), and leaves every connection either established or
//! in an error event in bounded time.
//!
//! What the agent does not do: QP state. It carries the numbers a QP needs (QPN, starting
//! PSN, MTU, responder resources, initiator depth, retry counts) both ways; the consumer
//! moves its QP with them. Addresses are the consumer's too: a [`Peer`] is echoed back on
//! every MAD sent to it.

use std::collections::VecDeque;

use hashbrown::HashMap;
use rand::{RngCore, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::wire::mad::{
    CmMad, CmMessage, CmPath, Dreq, Ids, MadError, Mra, Rej, Rep, Req, SidrRep, SidrReq, MAD_LEN,
};
use crate::wire::MacAddr;

#[cfg(test)]
mod tests;

/// A connection, by the agent's local communication ID.
pub type ConnId = u32;

/// Where a MAD goes (or came from): the peer port's GID and the next hop's MAC. The agent
/// only echoes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Peer {
    /// The peer port's GID.
    pub gid: [u8; 16],
    /// The MAC to send to.
    pub mac: MacAddr,
}

/// A MAD to send on QP1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    /// Its destination.
    pub peer: Peer,
    /// The MAD.
    pub mad: [u8; MAD_LEN],
}

/// REJ reasons (IBTA table 109) the agent sends or reports.
pub mod reason {
    /// No QP available.
    pub const NO_QP: u16 = 1;
    /// The REQ's service ID is not listened on.
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// A stale connection: the peer's communication ID is in use.
    pub const STALE_CONN: u16 = 10;
    /// The consumer rejected.
    pub const CONSUMER_REJECT: u16 = 28;
    /// The peer did not answer in time (what a REJ after exhausted retries says).
    pub const TIMEOUT: u16 = 1;
}

/// What an active side asks for in its REQ.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ConnectParams {
    /// The service (rdma_cm: port space and port).
    pub service_id: u64,
    /// The local QP.
    pub qpn: u32,
    /// Its first PSN.
    pub psn: u32,
    /// READs and atomics it takes at once (`max_dest_rd_atomic`).
    pub responder_resources: u8,
    /// READs and atomics it issues at once (`max_rd_atomic`).
    pub initiator_depth: u8,
    /// Transport retries.
    pub retry_count: u8,
    /// RNR retries.
    pub rnr_retry_count: u8,
    /// Path MTU (`enum ibv_mtu`).
    pub path_mtu: u8,
    /// 0 RC, 1 UC.
    pub transport_service_type: u8,
    /// The QP takes receives from an SRQ.
    pub srq: bool,
    /// The path (GIDs, hop limit, traffic class, ACK timeout).
    pub path: CmPath,
    /// The CM response timeout (4.096 µs × 2^n) both sides use; rdma_cm's is 20.
    pub response_timeout: u8,
    /// CM retries (rdma_cm: 15).
    pub max_cm_retries: u8,
    /// Private data (rdma_cm's IP header first), up to 92 bytes.
    pub private_data: Vec<u8>,
}

/// What a passive side answers in its REP.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct AcceptParams {
    /// The local QP.
    pub qpn: u32,
    /// Its first PSN.
    pub psn: u32,
    /// READs and atomics it takes at once.
    pub responder_resources: u8,
    /// READs and atomics it issues at once.
    pub initiator_depth: u8,
    /// RNR retries.
    pub rnr_retry_count: u8,
    /// The QP takes receives from an SRQ.
    pub srq: bool,
    /// Private data, up to 196 bytes.
    pub private_data: Vec<u8>,
}

/// A received REQ, as the consumer needs it to accept.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ReqInfo {
    /// The service asked for.
    pub service_id: u64,
    /// The peer's QP.
    pub qpn: u32,
    /// Its first PSN.
    pub psn: u32,
    /// READs and atomics the peer takes at once.
    pub responder_resources: u8,
    /// READs and atomics the peer issues at once.
    pub initiator_depth: u8,
    /// Transport retries.
    pub retry_count: u8,
    /// RNR retries.
    pub rnr_retry_count: u8,
    /// Path MTU.
    pub path_mtu: u8,
    /// 0 RC, 1 UC.
    pub transport_service_type: u8,
    /// The peer's QP uses an SRQ.
    pub srq: bool,
    /// The path as the peer sent it (its local is our remote).
    pub path: CmPath,
    /// The private data (92 bytes).
    pub private_data: Vec<u8>,
}

/// A received REP.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RepInfo {
    /// The peer's QP.
    pub qpn: u32,
    /// Its first PSN.
    pub psn: u32,
    /// READs and atomics the peer takes at once.
    pub responder_resources: u8,
    /// READs and atomics the peer issues at once.
    pub initiator_depth: u8,
    /// RNR retries.
    pub rnr_retry_count: u8,
    /// The peer's QP uses an SRQ.
    pub srq: bool,
    /// The private data (196 bytes).
    pub private_data: Vec<u8>,
}

/// What the agent tells its consumer.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum CmEvent {
    /// A REQ for a service listened on: answer with [`CmAgent::accept`] or
    /// [`CmAgent::reject`].
    Request {
        /// The new connection.
        conn: ConnId,
        /// Where it came from.
        peer: Peer,
        /// What it asks.
        req: ReqInfo,
    },
    /// The REP to a REQ of ours: move the QP to RTR and RTS with it, then
    /// [`CmAgent::ready_to_use`].
    Reply {
        /// The connection.
        conn: ConnId,
        /// What the peer answered.
        rep: RepInfo,
    },
    /// The connection is established (passive: the RTU came; active: after
    /// `ready_to_use`).
    Established {
        /// The connection.
        conn: ConnId,
    },
    /// The peer rejected (or a REQ went to a service nobody listens on).
    Rejected {
        /// The connection.
        conn: ConnId,
        /// IBTA table 109.
        reason: u16,
        /// The REJ's private data.
        private_data: Vec<u8>,
    },
    /// Our REQ (or SIDR_REQ) went unanswered through every retry.
    Unreachable {
        /// The connection (or SIDR request).
        conn: ConnId,
    },
    /// Our REP went unanswered through every retry (the connection is gone).
    ConnectError {
        /// The connection.
        conn: ConnId,
    },
    /// The connection is over: the peer's DREQ came (and was answered), or ours was
    /// answered or timed out.
    Disconnected {
        /// The connection.
        conn: ConnId,
    },
    /// The connection left time wait: its communication ID and QP may be reused.
    TimewaitExit {
        /// The connection.
        conn: ConnId,
    },
    /// A SIDR_REQ for a service listened on: answer with [`CmAgent::sidr_reply`].
    SidrRequest {
        /// The request (answer it by this).
        conn: ConnId,
        /// Where it came from.
        peer: Peer,
        /// The service.
        service_id: u64,
        /// Its private data (216 bytes).
        private_data: Vec<u8>,
    },
    /// The SIDR_REP to our SIDR_REQ.
    SidrReply {
        /// The request.
        conn: ConnId,
        /// 0 valid; else IBTA table 121's reason.
        status: u8,
        /// The serving UD QP.
        qpn: u32,
        /// Its Q_Key.
        qkey: u32,
        /// Its private data.
        private_data: Vec<u8>,
    },
}

/// Why the consumer's call was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CmError {
    /// No such connection.
    #[error("no connection {0:#x}")]
    NoConn(ConnId),
    /// The connection is not in a state the call applies to.
    #[error("connection {conn:#x} is {state}, the call needs another state")]
    State {
        /// The connection.
        conn: ConnId,
        /// Its state.
        state: &'static str,
    },
    /// The service is already listened on.
    #[error("service {0:#x} is already listened on")]
    InUse(u64),
    /// The message could not be written (private data too long).
    #[error(transparent)]
    Mad(#[from] MadError),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Active: REQ sent, no REP yet.
    ReqSent,
    /// Passive: REQ received, the consumer has not answered.
    ReqRcvd,
    /// Passive: REP sent, no RTU yet.
    RepSent,
    /// Active: REP received, the consumer has not sent the RTU.
    RepRcvd,
    Established,
    /// DREQ sent, no DREP yet.
    DreqSent,
    TimeWait,
    /// Active SIDR: SIDR_REQ sent.
    SidrSent,
}

impl State {
    const fn name(self) -> &'static str {
        match self {
            Self::ReqSent => "REQ sent",
            Self::ReqRcvd => "REQ received",
            Self::RepSent => "REP sent",
            Self::RepRcvd => "REP received",
            Self::Established => "established",
            Self::DreqSent => "DREQ sent",
            Self::TimeWait => "in time wait",
            Self::SidrSent => "SIDR_REQ sent",
        }
    }
}

#[derive(Debug)]
struct Conn {
    state: State,
    peer: Peer,
    remote_comm_id: u32,
    /// The peer's QP (DREQ names it).
    remote_qpn: u32,
    /// The transaction of the exchange in progress.
    tid: u64,
    /// What goes again when the deadline passes unanswered.
    resend: Option<[u8; MAD_LEN]>,
    deadline: Option<u64>,
    retries_left: u8,
    /// The wait for an answer (CM response timeout, plus what an MRA asked for).
    wait_ns: u64,
    /// Time wait's length.
    timewait_ns: u64,
    /// Passive: the last REP, for a duplicate REQ; active: the last RTU, for a duplicate REP.
    answer: Option<[u8; MAD_LEN]>,
    /// Active, to our own address for a service we do not listen on: whether we answer our
    /// own REQ when it comes back to us (see [`CmAgent::connect`]).
    rej_own_req: bool,
}

/// 4.096 µs × 2^n: the CM's (and the transport's) timeout encoding.
pub const fn timeout_ns(n: u8) -> u64 {
    4096u64 << if n > 31 { 31 } else { n }
}

/// A SIDR request as its sender names it: the sender's GID and its request ID.
type SidrKey = ([u8; 16], u32);

/// Retries kept for answered SIDR_REQs, so a duplicate gets the same SIDR_REP.
const SIDR_CACHE: usize = 64;

/// A MAD that nothing of this agent's claims: a request for a service it does not listen
/// on, or a DREQ for a connection it does not hold. Alone on its port the agent answers
/// both (REJ "invalid service ID", SIDR_REP "rejected", DREP); beside other agents on the
/// same port (other processes on one interface) the MAD may be another's, and the
/// [`CmAgent::set_unclaimed_policy`] decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unclaimed {
    /// A REQ or SIDR_REQ for this service ID.
    Service(u64),
    /// A DREQ for this (to us unknown) local communication ID.
    Connection(ConnId),
}

/// Whether to answer an [`Unclaimed`] MAD.
pub type UnclaimedPolicy = Box<dyn FnMut(Unclaimed) -> bool + Send>;

/// The policy, so the agent stays `Debug`.
struct Policy(UnclaimedPolicy);

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UnclaimedPolicy")
    }
}

/// One port's communication manager.
#[derive(Debug)]
pub struct CmAgent {
    ca_guid: u64,
    rng: Xoshiro256PlusPlus,
    next_comm_id: u32,
    conns: HashMap<ConnId, Conn>,
    /// (peer GID, the peer's communication ID) of passive connections: duplicate REQs.
    by_remote: HashMap<([u8; 16], u32), ConnId>,
    listeners: hashbrown::HashSet<u64>,
    /// SIDR requests answered: (peer GID, request ID) and the SIDR_REP sent.
    sidr_answers: VecDeque<(SidrKey, [u8; MAD_LEN])>,
    /// SIDR requests received and not answered yet: ConnId -> (peer, request ID, tid,
    /// service).
    sidr_pending: HashMap<ConnId, (Peer, u32, u64, u64)>,
    out: VecDeque<Outgoing>,
    events: VecDeque<CmEvent>,
    unclaimed: Option<Policy>,
}

impl CmAgent {
    /// An agent for a port of the CA with GUID `ca_guid`; `seed` picks its communication IDs
    /// and transaction IDs (a random one in use, a fixed one for replayable tests).
    pub fn new(ca_guid: u64, seed: u64) -> Self {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
        let next_comm_id = rng.next_u32() | 1;
        Self {
            ca_guid,
            rng,
            next_comm_id,
            conns: HashMap::new(),
            by_remote: HashMap::new(),
            listeners: hashbrown::HashSet::new(),
            sidr_answers: VecDeque::new(),
            sidr_pending: HashMap::new(),
            out: VecDeque::new(),
            events: VecDeque::new(),
            unclaimed: None,
        }
    }

    /// Sets who answers MADs nothing here claims (see [`Unclaimed`]): `f` returns true to
    /// answer. Without a policy the agent answers every one.
    pub fn set_unclaimed_policy(&mut self, f: UnclaimedPolicy) {
        self.unclaimed = Some(Policy(f));
    }

    fn answers(&mut self, u: Unclaimed) -> bool {
        self.unclaimed.as_mut().is_none_or(|p| (p.0)(u))
    }

    fn new_comm_id(&mut self) -> ConnId {
        loop {
            let id = self.next_comm_id;
            self.next_comm_id = self.next_comm_id.wrapping_add(1).max(1);
            if !self.conns.contains_key(&id) && !self.sidr_pending.contains_key(&id) {
                return id;
            }
        }
    }

    fn new_tid(&mut self, conn: ConnId) -> u64 {
        // The connection in the low half (as Linux forms it), a fresh sequence in the high.
        u64::from(self.rng.next_u32()) << 32 | u64::from(conn)
    }

    fn send(&mut self, peer: Peer, tid: u64, msg: CmMessage<'_>) -> Result<[u8; MAD_LEN], CmError> {
        let mut mad = [0u8; MAD_LEN];
        CmMad::new(tid, msg).emit(&mut mad)?;
        self.out.push_back(Outgoing { peer, mad });
        Ok(mad)
    }

    /// Takes REQs and SIDR_REQs for `service_id`.
    pub fn listen(&mut self, service_id: u64) -> Result<(), CmError> {
        if !self.listeners.insert(service_id) {
            return Err(CmError::InUse(service_id));
        }
        Ok(())
    }

    /// Stops taking requests for `service_id` (connections made stay).
    pub fn stop_listening(&mut self, service_id: u64) {
        self.listeners.remove(&service_id);
    }

    /// Sends a REQ to `peer`; the connection's ID.
    pub fn connect(&mut self, now: u64, peer: Peer, p: &ConnectParams) -> Result<ConnId, CmError> {
        let id = self.new_comm_id();
        let tid = self.new_tid(id);
        let req = Req {
            local_comm_id: id,
            vendor_id: 0,
            service_id: p.service_id,
            local_ca_guid: self.ca_guid,
            local_qkey: 0,
            local_qpn: p.qpn,
            responder_resources: p.responder_resources,
            local_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: p.response_timeout,
            transport_service_type: p.transport_service_type,
            end_to_end_flow_control: true,
            starting_psn: p.psn & 0xff_ffff,
            local_cm_response_timeout: p.response_timeout,
            retry_count: p.retry_count,
            pkey: 0xffff,
            path_mtu: p.path_mtu,
            rdc_exists: false,
            rnr_retry_count: p.rnr_retry_count,
            max_cm_retries: p.max_cm_retries,
            srq: p.srq,
            extended_transport_type: 0,
            primary: p.path,
            alternate: CmPath::default(),
            sap_supported: false,
            private_data: &p.private_data,
        };
        let mad = self.send(peer, tid, CmMessage::Req(req))?;
        let wait = timeout_ns(p.response_timeout);
        // A REQ to our own address comes back to us, as to every agent of the port's
        // processes, and may come back late. Whether we are the one to refuse it when we do
        // not listen is decided now, while another process's listener, if any, is still there
        // (it may be gone, having answered, when our copy arrives).
        let rej_own_req = p.path.local_gid == peer.gid
            && !self.listeners.contains(&p.service_id)
            && self.answers(Unclaimed::Service(p.service_id));
        self.conns.insert(
            id,
            Conn {
                state: State::ReqSent,
                peer,
                remote_comm_id: 0,
                remote_qpn: 0,
                tid,
                resend: Some(mad),
                deadline: Some(now + wait),
                retries_left: p.max_cm_retries,
                wait_ns: wait,
                timewait_ns: timewait_ns(p.path.local_ack_timeout),
                answer: None,
                rej_own_req,
            },
        );
        Ok(id)
    }

    /// Answers a [`CmEvent::Request`] with a REP; the connection is established when the
    /// RTU comes.
    pub fn accept(&mut self, now: u64, conn: ConnId, p: &AcceptParams) -> Result<(), CmError> {
        let c = self.conns.get(&conn).ok_or(CmError::NoConn(conn))?;
        if c.state != State::ReqRcvd {
            return Err(CmError::State {
                conn,
                state: c.state.name(),
            });
        }
        let (peer, tid, remote) = (c.peer, c.tid, c.remote_comm_id);
        let rep = Rep {
            local_comm_id: conn,
            remote_comm_id: remote,
            local_qkey: 0,
            local_qpn: p.qpn,
            vendor_id: 0,
            local_eecn: 0,
            starting_psn: p.psn & 0xff_ffff,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: 0,
            failover_accepted: 0,
            end_to_end_flow_control: true,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq,
            local_ca_guid: self.ca_guid,
            private_data: &p.private_data,
        };
        let mad = self.send(peer, tid, CmMessage::Rep(rep))?;
        let c = self.conns.get_mut(&conn).expect("checked above");
        c.state = State::RepSent;
        c.resend = Some(mad);
        c.answer = Some(mad);
        c.deadline = Some(now + c.wait_ns);
        Ok(())
    }

    /// Refuses a [`CmEvent::Request`] (or a [`CmEvent::Reply`]) with a REJ.
    pub fn reject(
        &mut self,
        conn: ConnId,
        reason: u16,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let c = self.conns.get(&conn).ok_or(CmError::NoConn(conn))?;
        let rejected = match c.state {
            State::ReqRcvd => 0,
            State::RepRcvd => 1,
            s => {
                return Err(CmError::State {
                    conn,
                    state: s.name(),
                })
            }
        };
        let (peer, tid, remote) = (c.peer, c.tid, c.remote_comm_id);
        self.send(
            peer,
            tid,
            CmMessage::Rej(Rej {
                local_comm_id: conn,
                remote_comm_id: remote,
                message_rejected: rejected,
                reason,
                ari: &[],
                private_data,
            }),
        )?;
        self.forget(conn);
        Ok(())
    }

    /// Sends the RTU after a [`CmEvent::Reply`] (the QP is in RTS): established.
    pub fn ready_to_use(&mut self, conn: ConnId, private_data: &[u8]) -> Result<(), CmError> {
        let c = self.conns.get(&conn).ok_or(CmError::NoConn(conn))?;
        if c.state != State::RepRcvd {
            return Err(CmError::State {
                conn,
                state: c.state.name(),
            });
        }
        // The RTU ends the REQ's transaction, so it carries its ID (as Linux's CM sends it).
        let (peer, remote, tid) = (c.peer, c.remote_comm_id, c.tid);
        let mad = self.send(
            peer,
            tid,
            CmMessage::Rtu(Ids {
                local_comm_id: conn,
                remote_comm_id: remote,
                private_data,
            }),
        )?;
        let c = self.conns.get_mut(&conn).expect("checked above");
        c.state = State::Established;
        c.answer = Some(mad);
        self.events.push_back(CmEvent::Established { conn });
        Ok(())
    }

    /// Sends a DREQ; [`CmEvent::Disconnected`] follows when the DREP comes (or the retries
    /// run out), then time wait. A connection that is not established yet is dropped with a
    /// REJ (the peer learns it is over) or, if only ours, forgotten.
    pub fn disconnect(
        &mut self,
        now: u64,
        conn: ConnId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let c = self.conns.get(&conn).ok_or(CmError::NoConn(conn))?;
        match c.state {
            State::Established | State::RepSent => {}
            State::ReqRcvd | State::RepRcvd => {
                return self.reject(conn, reason::CONSUMER_REJECT, private_data);
            }
            State::ReqSent | State::SidrSent => {
                self.forget(conn);
                return Ok(());
            }
            // Already disconnecting, or over.
            State::DreqSent | State::TimeWait => return Ok(()),
        }
        let (peer, remote, qpn) = (c.peer, c.remote_comm_id, c.remote_qpn);
        let tid = self.new_tid(conn);
        let mad = self.send(
            peer,
            tid,
            CmMessage::Dreq(Dreq {
                local_comm_id: conn,
                remote_comm_id: remote,
                remote_qpn: qpn,
                private_data,
            }),
        )?;
        let c = self.conns.get_mut(&conn).expect("checked above");
        c.state = State::DreqSent;
        c.tid = tid;
        c.resend = Some(mad);
        c.deadline = Some(now + c.wait_ns);
        c.retries_left = 15;
        Ok(())
    }

    /// Sends a SIDR_REQ for `service_id` to `peer`; its ID.
    pub fn sidr_request(
        &mut self,
        now: u64,
        peer: Peer,
        service_id: u64,
        response_timeout: u8,
        retries: u8,
        private_data: &[u8],
    ) -> Result<ConnId, CmError> {
        let id = self.new_comm_id();
        let tid = self.new_tid(id);
        let mad = self.send(
            peer,
            tid,
            CmMessage::SidrReq(SidrReq {
                request_id: id,
                pkey: 0xffff,
                service_id,
                private_data,
            }),
        )?;
        let wait = timeout_ns(response_timeout);
        self.conns.insert(
            id,
            Conn {
                state: State::SidrSent,
                peer,
                remote_comm_id: 0,
                remote_qpn: 0,
                tid,
                resend: Some(mad),
                deadline: Some(now + wait),
                retries_left: retries,
                wait_ns: wait,
                timewait_ns: 0,
                answer: None,
                rej_own_req: false,
            },
        );
        Ok(id)
    }

    /// Answers a [`CmEvent::SidrRequest`]: status 0 with the serving QP and Q_Key, or a
    /// refusal.
    pub fn sidr_reply(
        &mut self,
        conn: ConnId,
        status: u8,
        qpn: u32,
        qkey: u32,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let (peer, request_id, tid, service_id) = self
            .sidr_pending
            .remove(&conn)
            .ok_or(CmError::NoConn(conn))?;
        let mad = self.send(
            peer,
            tid,
            CmMessage::SidrRep(SidrRep {
                request_id,
                status,
                vendor_id: 0,
                qpn,
                service_id,
                qkey,
                info: &[],
                private_data,
            }),
        )?;
        if self.sidr_answers.len() == SIDR_CACHE {
            self.sidr_answers.pop_front();
        }
        self.sidr_answers.push_back(((peer.gid, request_id), mad));
        Ok(())
    }

    fn forget(&mut self, conn: ConnId) {
        if let Some(c) = self.conns.remove(&conn) {
            self.by_remote.remove(&(c.peer.gid, c.remote_comm_id));
        }
    }

    fn enter_timewait(&mut self, now: u64, conn: ConnId) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.state = State::TimeWait;
            c.resend = None;
            c.deadline = Some(now + c.timewait_ns);
        }
    }

    /// A MAD received on QP1 from `peer`. Bytes that are not a CM MAD this agent reads are
    /// the error (to count); a CM message for nothing of ours is dropped quietly, or
    /// answered as the spec asks.
    pub fn handle(&mut self, now: u64, peer: Peer, bytes: &[u8]) -> Result<(), MadError> {
        let mad = CmMad::parse(bytes)?;
        let tid = mad.header.tid;
        match mad.msg {
            CmMessage::Req(r) => self.on_req(now, peer, tid, &r),
            CmMessage::Rep(r) => self.on_rep(peer, tid, &r),
            CmMessage::Rtu(r) => self.on_rtu(r.remote_comm_id),
            CmMessage::Rej(r) => self.on_rej(r.remote_comm_id, r.reason, r.private_data),
            CmMessage::Mra(m) => self.on_mra(now, &m),
            CmMessage::Dreq(d) => self.on_dreq(now, peer, tid, &d),
            CmMessage::Drep(d) => self.on_drep(now, d.remote_comm_id),
            CmMessage::SidrReq(r) => self.on_sidr_req(peer, tid, &r),
            CmMessage::SidrRep(r) => self.on_sidr_rep(&r),
        }
        Ok(())
    }

    fn on_req(&mut self, now: u64, peer: Peer, tid: u64, r: &Req<'_>) {
        if let Some(&conn) = self.by_remote.get(&(peer.gid, r.local_comm_id)) {
            // A duplicate: the consumer is still deciding (MRA), or the REP went (again).
            let c = &self.conns[&conn];
            match c.state {
                State::ReqRcvd => {
                    let _ = self.send(
                        peer,
                        tid,
                        CmMessage::Mra(Mra {
                            local_comm_id: conn,
                            remote_comm_id: r.local_comm_id,
                            message_mraed: 0,
                            service_timeout: 20,
                            private_data: &[],
                        }),
                    );
                }
                State::RepSent | State::Established => {
                    if let Some(m) = c.answer {
                        self.out.push_back(Outgoing { peer, mad: m });
                    }
                }
                _ => {}
            }
            return;
        }
        if !self.listeners.contains(&r.service_id) {
            // Our own REQ to our own address, back to us: refused by us only if nobody
            // listened when it went (decided then); else the listener answers it.
            let own = self
                .conns
                .get(&r.local_comm_id)
                .filter(|c| c.state == State::ReqSent && c.peer.gid == peer.gid);
            let answer = match own {
                Some(c) => c.rej_own_req,
                None => self.answers(Unclaimed::Service(r.service_id)),
            };
            if !answer {
                return;
            }
            let _ = self.send(
                peer,
                tid,
                CmMessage::Rej(Rej {
                    local_comm_id: 0,
                    remote_comm_id: r.local_comm_id,
                    message_rejected: 0,
                    reason: reason::INVALID_SERVICE_ID,
                    ari: &[],
                    private_data: &[],
                }),
            );
            return;
        }
        let conn = self.new_comm_id();
        let wait = timeout_ns(r.remote_cm_response_timeout);
        self.conns.insert(
            conn,
            Conn {
                state: State::ReqRcvd,
                peer,
                remote_comm_id: r.local_comm_id,
                remote_qpn: r.local_qpn,
                tid,
                resend: None,
                deadline: None,
                retries_left: r.max_cm_retries,
                wait_ns: wait,
                timewait_ns: timewait_ns(r.primary.local_ack_timeout),
                answer: None,
                rej_own_req: false,
            },
        );
        let _ = now;
        self.by_remote.insert((peer.gid, r.local_comm_id), conn);
        self.events.push_back(CmEvent::Request {
            conn,
            peer,
            req: ReqInfo {
                service_id: r.service_id,
                qpn: r.local_qpn,
                psn: r.starting_psn,
                responder_resources: r.responder_resources,
                initiator_depth: r.initiator_depth,
                retry_count: r.retry_count,
                rnr_retry_count: r.rnr_retry_count,
                path_mtu: r.path_mtu,
                transport_service_type: r.transport_service_type,
                srq: r.srq,
                path: r.primary,
                private_data: r.private_data.to_vec(),
            },
        });
    }

    fn on_rep(&mut self, peer: Peer, tid: u64, r: &Rep<'_>) {
        let Some(c) = self.conns.get_mut(&r.remote_comm_id) else {
            return;
        };
        match c.state {
            State::ReqSent => {
                c.state = State::RepRcvd;
                c.remote_comm_id = r.local_comm_id;
                c.remote_qpn = r.local_qpn;
                c.tid = tid;
                c.resend = None;
                c.deadline = None;
                let conn = r.remote_comm_id;
                self.events.push_back(CmEvent::Reply {
                    conn,
                    rep: RepInfo {
                        qpn: r.local_qpn,
                        psn: r.starting_psn,
                        responder_resources: r.responder_resources,
                        initiator_depth: r.initiator_depth,
                        rnr_retry_count: r.rnr_retry_count,
                        srq: r.srq,
                        private_data: r.private_data.to_vec(),
                    },
                });
            }
            // The RTU was lost: the same RTU again.
            State::Established => {
                if let Some(m) = c.answer {
                    self.out.push_back(Outgoing { peer, mad: m });
                }
            }
            _ => {}
        }
    }

    fn on_rtu(&mut self, conn: ConnId) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if c.state == State::RepSent {
            c.state = State::Established;
            c.resend = None;
            c.deadline = None;
            self.events.push_back(CmEvent::Established { conn });
        }
    }

    fn on_rej(&mut self, conn: ConnId, reason: u16, private_data: &[u8]) {
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        if matches!(c.state, State::ReqSent | State::RepSent | State::RepRcvd) {
            self.forget(conn);
            self.events.push_back(CmEvent::Rejected {
                conn,
                reason,
                private_data: private_data.to_vec(),
            });
        }
    }

    fn on_mra(&mut self, now: u64, m: &Mra<'_>) {
        if let Some(c) = self.conns.get_mut(&m.remote_comm_id) {
            if matches!(c.state, State::ReqSent | State::RepSent) {
                // The peer needs longer: wait that long, once more, before resending.
                c.deadline = Some(now + c.wait_ns + timeout_ns(m.service_timeout));
            }
        }
    }

    fn on_dreq(&mut self, now: u64, peer: Peer, tid: u64, d: &Dreq<'_>) {
        let drep = |remote: u32| {
            CmMessage::Drep(Ids {
                local_comm_id: d.remote_comm_id,
                remote_comm_id: remote,
                private_data: &[],
            })
        };
        let conn = d.remote_comm_id;
        let Some(c) = self.conns.get(&conn) else {
            // Nothing of ours (gone already, or another agent's): a DREP all the same, so
            // the peer stops, unless the policy leaves it to another.
            if self.answers(Unclaimed::Connection(conn)) {
                let _ = self.send(peer, tid, drep(d.local_comm_id));
            }
            return;
        };
        match c.state {
            State::Established | State::RepSent | State::DreqSent => {
                // A DREQ before the RTU: the peer got our REP and went on (its RTU is late
                // or lost), so the connection was established before it ends.
                if c.state == State::RepSent {
                    self.events.push_back(CmEvent::Established { conn });
                }
                let remote = c.remote_comm_id;
                let _ = self.send(peer, tid, drep(remote));
                self.enter_timewait(now, conn);
                self.events.push_back(CmEvent::Disconnected { conn });
            }
            State::TimeWait => {
                let remote = c.remote_comm_id;
                let _ = self.send(peer, tid, drep(remote));
            }
            _ => {}
        }
    }

    fn on_drep(&mut self, now: u64, conn: ConnId) {
        if self
            .conns
            .get(&conn)
            .is_some_and(|c| c.state == State::DreqSent)
        {
            self.enter_timewait(now, conn);
            self.events.push_back(CmEvent::Disconnected { conn });
        }
    }

    fn on_sidr_req(&mut self, peer: Peer, tid: u64, r: &SidrReq<'_>) {
        if let Some((_, m)) = self
            .sidr_answers
            .iter()
            .find(|(k, _)| *k == (peer.gid, r.request_id))
        {
            self.out.push_back(Outgoing { peer, mad: *m });
            return;
        }
        if self
            .sidr_pending
            .values()
            .any(|&(p, id, _, _)| p.gid == peer.gid && id == r.request_id)
        {
            return;
        }
        if !self.listeners.contains(&r.service_id) {
            if !self.answers(Unclaimed::Service(r.service_id)) {
                return;
            }
            let _ = self.send(
                peer,
                tid,
                CmMessage::SidrRep(SidrRep {
                    request_id: r.request_id,
                    status: 1,
                    vendor_id: 0,
                    qpn: 0,
                    service_id: r.service_id,
                    qkey: 0,
                    info: &[],
                    private_data: &[],
                }),
            );
            return;
        }
        let conn = self.new_comm_id();
        self.sidr_pending
            .insert(conn, (peer, r.request_id, tid, r.service_id));
        self.events.push_back(CmEvent::SidrRequest {
            conn,
            peer,
            service_id: r.service_id,
            private_data: r.private_data.to_vec(),
        });
    }

    fn on_sidr_rep(&mut self, r: &SidrRep<'_>) {
        let conn = r.request_id;
        if self
            .conns
            .get(&conn)
            .is_some_and(|c| c.state == State::SidrSent)
        {
            self.conns.remove(&conn);
            self.events.push_back(CmEvent::SidrReply {
                conn,
                status: r.status,
                qpn: r.qpn,
                qkey: r.qkey,
                private_data: r.private_data.to_vec(),
            });
        }
    }

    /// The next MAD to send.
    pub fn poll_transmit(&mut self) -> Option<Outgoing> {
        self.out.pop_front()
    }

    /// The next event for the consumer.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// The earliest deadline, if any.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.conns.values().filter_map(|c| c.deadline).min()
    }

    /// Runs the deadlines that passed by `now`: resends, gives up, leaves time wait.
    pub fn handle_timeout(&mut self, now: u64) {
        let due: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|d| d <= now))
            .map(|(&id, _)| id)
            .collect();
        for conn in due {
            let Some(c) = self.conns.get_mut(&conn) else {
                continue;
            };
            if c.state == State::TimeWait {
                self.forget(conn);
                self.events.push_back(CmEvent::TimewaitExit { conn });
                continue;
            }
            if c.retries_left > 0 {
                c.retries_left -= 1;
                c.deadline = Some(now + c.wait_ns);
                if let Some(m) = c.resend {
                    self.out.push_back(Outgoing {
                        peer: c.peer,
                        mad: m,
                    });
                }
                continue;
            }
            // Out of retries.
            let (state, peer, tid, remote) = (c.state, c.peer, c.tid, c.remote_comm_id);
            match state {
                State::ReqSent => {
                    // Tell the peer too, in case only its answers were lost.
                    let _ = self.send(
                        peer,
                        tid,
                        CmMessage::Rej(Rej {
                            local_comm_id: conn,
                            remote_comm_id: remote,
                            message_rejected: 2,
                            reason: reason::TIMEOUT,
                            ari: &[],
                            private_data: &[],
                        }),
                    );
                    self.forget(conn);
                    self.events.push_back(CmEvent::Unreachable { conn });
                }
                State::SidrSent => {
                    self.forget(conn);
                    self.events.push_back(CmEvent::Unreachable { conn });
                }
                State::RepSent => {
                    self.forget(conn);
                    self.events.push_back(CmEvent::ConnectError { conn });
                }
                State::DreqSent => {
                    self.enter_timewait(now, conn);
                    self.events.push_back(CmEvent::Disconnected { conn });
                }
                _ => {
                    if let Some(c) = self.conns.get_mut(&conn) {
                        c.deadline = None;
                    }
                }
            }
        }
    }

    /// True while MADs wait to be sent or events to be taken.
    pub fn pending(&self) -> bool {
        !self.out.is_empty() || !self.events.is_empty()
    }

    /// True while MADs wait to be sent.
    pub fn sending(&self) -> bool {
        !self.out.is_empty()
    }

    /// Connections the agent holds (any state, time wait included).
    pub fn connections(&self) -> usize {
        self.conns.len() + self.sidr_pending.len()
    }
}

/// Time wait after a connection: twice the path's local ACK timeout, at least a millisecond
/// (what stray packets of the old connection need to die out).
fn timewait_ns(local_ack_timeout: u8) -> u64 {
    (2 * timeout_ns(local_ack_timeout)).max(1_000_000)
}
