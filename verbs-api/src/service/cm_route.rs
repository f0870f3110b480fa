//! The connection manager through a service. A port has one CM agent (QP1 is the port's, as
//! the kernel's rdma_cm has one per port), so the service runs it and every program shares
//! it: this module keeps which program listens on which service ID and which holds which
//! connection, carries each program's calls to the agent after checking them, and routes
//! the agent's events to the program they concern.
//!
//! The control thread owns all of it: calls arrive on it, and the agents' events wake it (an
//! eventfd each agent's notification writes), so a program's connect and the reply's routing
//! are never concurrent — a connection is in the table before its first event is routed.
//!
//! Events wait here, per program, until it asks ([`Request::CmTakeEvents`]): the event ring
//! in its control page carries only [`proto::CM_WAITING`], once until the program has
//! asked, because a CM event (private data, a path) does not fit a ring entry.
//!
//! When a program goes, what it held ends on the wire as the kernel's rdma_cm ends it when a
//! process's file closes: a DREQ for each connection, a REJ for a request never answered,
//! a SIDR_REP "rejected" for a SIDR_REQ, and its listeners stop.
//!
//! [`Request::CmTakeEvents`]: super::proto::Request::CmTakeEvents

use std::collections::{HashMap, VecDeque};
use std::os::fd::AsFd;
use std::sync::Arc;

use ferroce_stack::cm::{reason, CmError, CmEvent, ConnId};

use super::proto::{self, CmCall, Response, MAX_MESSAGE};
use super::socket::Doorbell;
use crate::cm::{CmCallError, ConnectionManager};
use crate::verbs::Context;

/// Bytes of events one answer carries at most (the rest of [`MAX_MESSAGE`] is the
/// envelope's, with room to spare).
const BATCH_BYTES: usize = MAX_MESSAGE - 512;

/// Events one program may have waiting; past this it is not reading them, and the oldest
/// go (a program that never asks cannot make the service hold memory without bound).
const MAX_WAITING: usize = 4096;

/// Connections and listeners one program may hold.
const MAX_HELD: usize = 1 << 14;

/// A program's side of the CM: how to tell it events wait, and the events.
struct Program {
    /// Rings the program's event ring with [`proto::CM_WAITING`]; false when it was full.
    signal: Box<dyn Fn() -> bool + Send>,
    waiting: VecDeque<(u32, CmEvent)>,
    /// A [`proto::CM_WAITING`] is in its ring and it has not asked since.
    signalled: bool,
}

/// Who listens and who holds each connection, across every program.
pub(super) struct CmRoutes {
    /// Per device: its agent, from a program's first call on it.
    managers: Vec<Option<ConnectionManager>>,
    /// Written by every agent after it queues an event.
    bell: Arc<Doorbell>,
    listeners: HashMap<(u32, u64), u64>,
    conns: HashMap<(u32, ConnId), u64>,
    programs: HashMap<u64, Program>,
}

impl CmRoutes {
    /// Routes for `devices` (no agent starts until a program calls on its device).
    pub(super) fn new(devices: usize) -> std::io::Result<Self> {
        Ok(Self {
            managers: (0..devices).map(|_| None).collect(),
            bell: Arc::new(Doorbell::new()?),
            listeners: HashMap::new(),
            conns: HashMap::new(),
            programs: HashMap::new(),
        })
    }

    /// What the control thread polls: readable when an agent queued events.
    pub(super) fn fd(&self) -> &impl AsFd {
        &*self.bell
    }

    /// Program `sid`'s entry, made on its first call with `signal`.
    fn program(&mut self, sid: u64, signal: impl FnOnce() -> Box<dyn Fn() -> bool + Send>) {
        self.programs.entry(sid).or_insert_with(|| Program {
            signal: signal(),
            waiting: VecDeque::new(),
            signalled: false,
        });
    }

    fn manager(&mut self, devices: &[Context], device: u32) -> Option<&ConnectionManager> {
        let d = device as usize;
        let slot = self.managers.get_mut(d)?;
        if slot.is_none() {
            let cm = devices.get(d)?.connection_manager();
            let bell = self.bell.clone();
            cm.set_notify(Box::new(move || bell.ring()));
            *slot = Some(cm);
        }
        slot.as_ref()
    }

    /// Carries out program `sid`'s `call` on `device`. `owns_qp(qpn)` says whether a QP
    /// number is one of the program's QPs on that device; `signal` tells the program
    /// events wait (kept from its first call).
    pub(super) fn call(
        &mut self,
        devices: &[Context],
        sid: u64,
        signal: impl FnOnce() -> Box<dyn Fn() -> bool + Send>,
        device: u32,
        call: CmCall,
        owns_qp: impl Fn(u32) -> bool,
    ) -> Response {
        self.program(sid, signal);
        let Some(cm) = self.manager(devices, device).cloned() else {
            return refuse(libc::ENODEV, format!("no device {device}"));
        };
        let held = self.conns.values().filter(|&&o| o == sid).count()
            + self.listeners.values().filter(|&&o| o == sid).count();
        let mine = |conn: ConnId| self.conns.get(&(device, conn)) == Some(&sid);
        let not_mine = |conn: ConnId| refuse(libc::EINVAL, format!("no connection {conn:#x}"));
        let foreign_qp =
            |qpn: u32| refuse(libc::EINVAL, format!("QP {qpn:#x} is not this program's"));
        match call {
            CmCall::Listen(svc) => {
                if held >= MAX_HELD {
                    return refuse(libc::ENOMEM, "too many connections and listeners");
                }
                if self.listeners.contains_key(&(device, svc)) {
                    return refuse(
                        libc::EADDRINUSE,
                        format!("service {svc:#x} is already listened on"),
                    );
                }
                match cm.listen(svc) {
                    Ok(()) => {
                        self.listeners.insert((device, svc), sid);
                        Response::Ok
                    }
                    Err(e) => cm_refusal(e),
                }
            }
            CmCall::StopListening(svc) => {
                if self.listeners.get(&(device, svc)) == Some(&sid) {
                    self.listeners.remove(&(device, svc));
                    cm.stop_listening(svc);
                }
                Response::Ok
            }
            CmCall::Connect { peer, params } => {
                if held >= MAX_HELD {
                    return refuse(libc::ENOMEM, "too many connections and listeners");
                }
                if !owns_qp(params.qpn) {
                    return foreign_qp(params.qpn);
                }
                match cm.connect(peer, &params) {
                    Ok(conn) => {
                        self.conns.insert((device, conn), sid);
                        Response::CmConn(conn)
                    }
                    Err(e) => cm_refusal(e),
                }
            }
            CmCall::Accept { conn, params } => {
                if !mine(conn) {
                    return not_mine(conn);
                }
                if !owns_qp(params.qpn) {
                    return foreign_qp(params.qpn);
                }
                done(cm.accept(conn, &params))
            }
            CmCall::Reject {
                conn,
                reason,
                private_data,
            } => {
                if !mine(conn) {
                    return not_mine(conn);
                }
                let r = done(cm.reject(conn, reason, &private_data));
                if r == Response::Ok {
                    // The agent forgot it.
                    self.conns.remove(&(device, conn));
                }
                r
            }
            CmCall::ReadyToUse { conn, private_data } => {
                if !mine(conn) {
                    return not_mine(conn);
                }
                done(cm.ready_to_use(conn, &private_data))
            }
            CmCall::Disconnect { conn, private_data } => {
                if !mine(conn) {
                    return not_mine(conn);
                }
                done(cm.disconnect(conn, &private_data))
            }
            CmCall::SidrRequest {
                peer,
                service_id,
                private_data,
            } => {
                if held >= MAX_HELD {
                    return refuse(libc::ENOMEM, "too many connections and listeners");
                }
                match cm.sidr_request(peer, service_id, &private_data) {
                    Ok(conn) => {
                        self.conns.insert((device, conn), sid);
                        Response::CmConn(conn)
                    }
                    Err(e) => cm_refusal(e),
                }
            }
            CmCall::SidrReply {
                conn,
                status,
                qpn,
                qkey,
                private_data,
            } => {
                if !mine(conn) {
                    return not_mine(conn);
                }
                if status == 0 && !owns_qp(qpn) {
                    return foreign_qp(qpn);
                }
                let r = done(cm.sidr_reply(conn, status, qpn, qkey, &private_data));
                if r == Response::Ok {
                    self.conns.remove(&(device, conn));
                }
                r
            }
            CmCall::Connections => Response::Count(held as u64),
        }
    }

    /// The events waiting for program `sid`, as many as one answer holds.
    pub(super) fn take(&mut self, sid: u64) -> Response {
        let Some(p) = self.programs.get_mut(&sid) else {
            return Response::CmEvents {
                events: Vec::new(),
                more: false,
            };
        };
        p.signalled = false;
        let mut events = Vec::new();
        let mut bytes = 0;
        while let Some(e) = p.waiting.front() {
            let n = proto::encode(e).len();
            if bytes + n > BATCH_BYTES && !events.is_empty() {
                break;
            }
            bytes += n;
            events.extend(p.waiting.pop_front());
        }
        Response::CmEvents {
            events,
            more: !p.waiting.is_empty(),
        }
    }

    /// Takes every event the agents queued to the programs they concern.
    pub(super) fn pump(&mut self) {
        self.bell.drain();
        for d in 0..self.managers.len() {
            let Some(cm) = self.managers[d].clone() else {
                continue;
            };
            while let Some(e) = cm.try_next_event() {
                self.route(&cm, d as u32, e);
            }
        }
    }

    fn route(&mut self, cm: &ConnectionManager, device: u32, e: CmEvent) {
        let owner = match &e {
            CmEvent::Request { conn, req, .. } => {
                let Some(&sid) = self.listeners.get(&(device, req.service_id)) else {
                    let _ = cm.reject(*conn, reason::INVALID_SERVICE_ID, &[]);
                    return;
                };
                self.conns.insert((device, *conn), sid);
                sid
            }
            CmEvent::SidrRequest {
                conn, service_id, ..
            } => {
                let Some(&sid) = self.listeners.get(&(device, *service_id)) else {
                    let _ = cm.sidr_reply(*conn, 1, 0, 0, &[]);
                    return;
                };
                self.conns.insert((device, *conn), sid);
                sid
            }
            CmEvent::Reply { conn, .. }
            | CmEvent::Established { conn }
            | CmEvent::Disconnected { conn } => match self.conns.get(&(device, *conn)) {
                Some(&sid) => sid,
                None => return,
            },
            // The connection's last event: the agent has forgotten it.
            CmEvent::Rejected { conn, .. }
            | CmEvent::Unreachable { conn }
            | CmEvent::ConnectError { conn }
            | CmEvent::TimewaitExit { conn }
            | CmEvent::SidrReply { conn, .. } => match self.conns.remove(&(device, *conn)) {
                Some(sid) => sid,
                None => return,
            },
        };
        let Some(p) = self.programs.get_mut(&owner) else {
            return;
        };
        if p.waiting.len() >= MAX_WAITING {
            p.waiting.pop_front();
        }
        p.waiting.push_back((device, e));
        if !p.signalled {
            p.signalled = (p.signal)();
        }
    }

    /// Program `sid` has gone: its listeners stop and its connections end on the wire.
    pub(super) fn leave(&mut self, sid: u64) {
        if self.programs.remove(&sid).is_none() {
            return;
        }
        let listening: Vec<_> = self
            .listeners
            .iter()
            .filter(|&(_, &o)| o == sid)
            .map(|(&k, _)| k)
            .collect();
        for (device, svc) in listening {
            self.listeners.remove(&(device, svc));
            if let Some(Some(cm)) = self.managers.get(device as usize) {
                cm.stop_listening(svc);
            }
        }
        let held: Vec<_> = self
            .conns
            .iter()
            .filter(|&(_, &o)| o == sid)
            .map(|(&k, _)| k)
            .collect();
        for (device, conn) in held {
            self.conns.remove(&(device, conn));
            let Some(Some(cm)) = self.managers.get(device as usize) else {
                continue;
            };
            // A DREQ, a REJ for a request not answered (the agent chooses by the
            // connection's state), or, for a SIDR_REQ (no connection), a refusal.
            if let Err(CmCallError::Cm(CmError::NoConn(_))) = cm.disconnect(conn, &[]) {
                let _ = cm.sidr_reply(conn, 1, 0, 0, &[]);
            }
        }
    }
}

fn refuse(errno: i32, message: impl Into<String>) -> Response {
    Response::Error {
        errno,
        message: message.into(),
    }
}

fn cm_refusal(e: CmCallError) -> Response {
    refuse(e.errno(), e.to_string())
}

fn done(r: Result<(), CmCallError>) -> Response {
    match r {
        Ok(()) => Response::Ok,
        Err(e) => cm_refusal(e),
    }
}
