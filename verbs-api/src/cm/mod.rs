//! The connection manager a crate user (and the librdmacm drop-in) connects QPs with: the
//! IBTA communication manager on the device's QP1 (see `ferroce_stack::cm` for the
//! protocol), so a peer whose CM is the Linux kernel's (a ConnectX, rxe) can be reached
//! without librdmacm, and ferroce's own librdmacm speaks the same.
//!
//! The agent runs in the device's first engine; calls here take its lock briefly, and its
//! events come back through [`ConnectionManager::next_event`] (or the notification a
//! program's event channel installs).

mod offer;
pub(crate) mod queue;

pub use offer::{Offer, MAX_OFFERED, OFFER_LEN};

use std::sync::Arc;
use std::time::Duration;

pub use ferroce_stack::cm::{
    reason, AcceptParams, CmError, CmEvent, ConnId, ConnectParams, Peer, RepInfo, ReqInfo,
    Unclaimed, UnclaimedPolicy,
};

use crate::engine::gsi::Gsi;
use crate::service::client::Client;
use crate::service::proto::{CmCall, Response};
use crate::service::ServiceError;
use crate::verbs::Context;
use queue::CmShared;

/// Why a connection manager call failed: the agent refused it, or (attached to a service)
/// the service did.
#[derive(Debug, thiserror::Error)]
pub enum CmCallError {
    /// The agent in this process refused.
    #[error(transparent)]
    Cm(#[from] CmError),
    /// The service refused (its agent's refusal, or a connection or QP not this
    /// program's), or has gone.
    #[error(transparent)]
    Service(#[from] ServiceError),
}

impl CmCallError {
    /// The errno librdmacm would set: `EADDRINUSE` for a service listened on, `EINVAL` for
    /// the agent's other refusals (no such connection, not in that state, private data too
    /// long); what the service said.
    pub fn errno(&self) -> i32 {
        match self {
            Self::Cm(CmError::InUse(_)) => libc::EADDRINUSE,
            Self::Cm(_) => libc::EINVAL,
            Self::Service(e) => e.errno(),
        }
    }
}

/// A device's connection manager (its first port). Clones share it.
#[derive(Clone, Debug)]
pub struct ConnectionManager {
    ctx: Context,
    shared: Arc<CmShared>,
    /// Attached to a service: its agent does the work; the device's number there.
    remote: Option<(Client, u32)>,
}

impl Context {
    /// The device's connection manager, started on first use: from then on its engine
    /// answers CM MADs on QP1 (before, they are dropped as for a QP that does not exist).
    /// Attached to a service, it is the service's agent, which every program of the
    /// service shares; this program hears only of its own listeners and connections.
    pub fn connection_manager(&self) -> ConnectionManager {
        if let Some(r) = self.dev.remote.as_ref() {
            return ConnectionManager {
                ctx: self.clone(),
                shared: r.client.cm_events(r.device),
                remote: Some((r.client.clone(), r.device)),
            };
        }
        let slot = &self.dev.engines[0];
        let mut e = slot.lock();
        let core = e.core_mut();
        if core.gsi.is_none() {
            let (mac, ip) = self.dev.ports[0];
            let seed = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0x5eed, |d| d.as_nanos() as u64)
                ^ u64::from(std::process::id()) << 32;
            let seed = if self.dev.sim.is_some() { 0x5eed } else { seed };
            core.gsi = Some(Box::new(Gsi::new(mac, ip, seed)));
            self.dev.home_gsi_on_first_engine();
            // MADs other processes on the port loop to its own address reach this engine.
            if let Some(inbox) = core.looped.as_ref() {
                crate::engine::looped::claim(ferroce_stack::wire::mad::GSI_QPN, inbox);
                crate::engine::looped::open_mailbox();
            }
        }
        let shared = core.gsi.as_ref().expect("just set").shared.clone();
        ConnectionManager {
            ctx: self.clone(),
            shared,
            remote: None,
        }
    }
}

impl ConnectionManager {
    /// Runs `f` on the agent with the engine's clock, then wakes the engine so what `f`
    /// queued goes out.
    fn with<T>(&self, f: impl FnOnce(&mut ferroce_stack::cm::CmAgent, u64) -> T) -> T {
        let slot = &self.ctx.dev.engines[0];
        let out = {
            let mut e = slot.lock();
            let now = e.port().now_ns();
            let g = e.core_mut().gsi.as_mut().expect("made with the manager");
            f(&mut g.agent, now)
        };
        slot.idle.wake();
        out
    }

    /// One call on the service's agent, when attached to one.
    fn call(&self, call: impl FnOnce() -> CmCall) -> Option<Result<Response, CmCallError>> {
        let (client, device) = self.remote.as_ref()?;
        Some(client.cm_call(*device, call()).map_err(CmCallError::from))
    }

    /// Waits until every MAD queued so far has gone to the port, at most `timeout`; false if
    /// some still wait then. For a process about to exit: the engine thread that sends them
    /// ends with it. Attached to a service, the service sends them: true at once.
    pub fn flush(&self, timeout: Duration) -> bool {
        if self.remote.is_some() {
            return true;
        }
        let until = std::time::Instant::now() + timeout;
        loop {
            if !self.with(|a, _| a.sending()) {
                return true;
            }
            if std::time::Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// The device this manager belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The address peers reach this port's CM at: its GID and MAC.
    pub fn local_peer(&self) -> Peer {
        let (mac, ip) = self.ctx.dev.ports[0];
        Peer {
            gid: crate::Gid::from_ip(ip).0,
            mac,
        }
    }

    /// Takes REQs and SIDR_REQs for `service_id`.
    pub fn listen(&self, service_id: u64) -> Result<(), CmCallError> {
        if let Some(r) = self.call(|| CmCall::Listen(service_id)) {
            return answered_ok(r);
        }
        Ok(self.with(|a, _| a.listen(service_id))?)
    }

    /// Stops taking requests for `service_id`.
    pub fn stop_listening(&self, service_id: u64) {
        if self.call(|| CmCall::StopListening(service_id)).is_some() {
            return;
        }
        self.with(|a, _| a.stop_listening(service_id));
    }

    /// Sends a REQ; [`CmEvent::Reply`], [`CmEvent::Rejected`] or [`CmEvent::Unreachable`]
    /// follows.
    pub fn connect(&self, peer: Peer, p: &ConnectParams) -> Result<ConnId, CmCallError> {
        let call = || CmCall::Connect {
            peer,
            params: p.clone(),
        };
        if let Some(r) = self.call(call) {
            return answered_conn(r);
        }
        Ok(self.with(|a, now| a.connect(now, peer, p))?)
    }

    /// Answers a [`CmEvent::Request`] with a REP.
    pub fn accept(&self, conn: ConnId, p: &AcceptParams) -> Result<(), CmCallError> {
        let call = || CmCall::Accept {
            conn,
            params: p.clone(),
        };
        if let Some(r) = self.call(call) {
            return answered_ok(r);
        }
        Ok(self.with(|a, now| a.accept(now, conn, p))?)
    }

    /// Refuses a request (or a reply) with a REJ.
    pub fn reject(
        &self,
        conn: ConnId,
        reason: u16,
        private_data: &[u8],
    ) -> Result<(), CmCallError> {
        let call = || CmCall::Reject {
            conn,
            reason,
            private_data: private_data.to_vec(),
        };
        if let Some(r) = self.call(call) {
            return answered_ok(r);
        }
        Ok(self.with(|a, _| a.reject(conn, reason, private_data))?)
    }

    /// Sends the RTU after a [`CmEvent::Reply`] (the QP is in RTS).
    pub fn ready_to_use(&self, conn: ConnId, private_data: &[u8]) -> Result<(), CmCallError> {
        let call = || CmCall::ReadyToUse {
            conn,
            private_data: private_data.to_vec(),
        };
        if let Some(r) = self.call(call) {
            return answered_ok(r);
        }
        Ok(self.with(|a, _| a.ready_to_use(conn, private_data))?)
    }

    /// Sends a DREQ (or ends a connection not yet made).
    pub fn disconnect(&self, conn: ConnId, private_data: &[u8]) -> Result<(), CmCallError> {
        let call = || CmCall::Disconnect {
            conn,
            private_data: private_data.to_vec(),
        };
        if let Some(r) = self.call(call) {
            return answered_ok(r);
        }
        Ok(self.with(|a, now| a.disconnect(now, conn, private_data))?)
    }

    /// Sends a SIDR_REQ for a UD service.
    pub fn sidr_request(
        &self,
        peer: Peer,
        service_id: u64,
        private_data: &[u8],
    ) -> Result<ConnId, CmCallError> {
        let call = || CmCall::SidrRequest {
            peer,
            service_id,
            private_data: private_data.to_vec(),
        };
        if let Some(r) = self.call(call) {
            return answered_conn(r);
        }
        Ok(self.with(|a, now| a.sidr_request(now, peer, service_id, 20, 15, private_data))?)
    }

    /// Answers a [`CmEvent::SidrRequest`].
    pub fn sidr_reply(
        &self,
        conn: ConnId,
        status: u8,
        qpn: u32,
        qkey: u32,
        private_data: &[u8],
    ) -> Result<(), CmCallError> {
        let call = || CmCall::SidrReply {
            conn,
            status,
            qpn,
            qkey,
            private_data: private_data.to_vec(),
        };
        if let Some(r) = self.call(call) {
            return answered_ok(r);
        }
        Ok(self.with(|a, _| a.sidr_reply(conn, status, qpn, qkey, private_data))?)
    }

    /// The next event, waiting up to `timeout`. On a simulated fabric nothing moves while
    /// this waits: run the fabric and take events with [`try_next_event`](Self::try_next_event).
    pub fn next_event(&self, timeout: Duration) -> Option<CmEvent> {
        self.shared.wait(timeout)
    }

    /// The next event, if one waits.
    pub fn try_next_event(&self) -> Option<CmEvent> {
        self.shared.try_next()
    }

    /// Calls `f` after each event is queued (once set, for good): how an event channel's
    /// file descriptor becomes readable.
    pub fn set_notify(&self, f: Box<dyn Fn() + Send + Sync>) -> bool {
        self.shared.notify.set(f).is_ok()
    }

    /// Sets who answers the MADs nothing of this agent claims (see [`Unclaimed`]): needed
    /// when several processes each run an agent on one interface, where every agent sees
    /// every MAD. Attached to a service, its agent is the port's only one and answers them
    /// all: the policy is not used.
    pub fn set_unclaimed_policy(&self, f: UnclaimedPolicy) {
        if self.remote.is_some() {
            return;
        }
        self.with(|a, _| a.set_unclaimed_policy(f));
    }

    /// Connections the agent holds (time wait included); attached to a service, the
    /// connections and listeners this program holds there.
    pub fn connections(&self) -> usize {
        if let Some(r) = self.call(|| CmCall::Connections) {
            return match r {
                Ok(Response::Count(n)) => n as usize,
                _ => 0,
            };
        }
        self.with(|a, _| a.connections())
    }
}

/// A service's answer to a call that answers nothing.
fn answered_ok(r: Result<Response, CmCallError>) -> Result<(), CmCallError> {
    match r? {
        Response::Ok => Ok(()),
        _ => Err(ServiceError::Protocol("unexpected answer").into()),
    }
}

/// A service's answer to a call that answers a connection ID.
fn answered_conn(r: Result<Response, CmCallError>) -> Result<ConnId, CmCallError> {
    match r? {
        Response::CmConn(c) => Ok(c),
        _ => Err(ServiceError::Protocol("unexpected answer").into()),
    }
}
