//! R2CCL's handling of one failed connection (seed 003), as a sans-IO state machine per
//! end: the error, the out-of-band notice, both ends' probes, the receiver's results sent
//! back, the sender's verdict by triangulation, and the notice that the connection moved.
//!
//! ```text
//!   sender (saw its QP fail)                    receiver
//!   on_error: ConnError ─────── out of band ──▶ on_notice
//!             probes → peer, third                probes → sender, third
//!                                               poll: probes done
//!   on_oob  ◀────────────────── ProbeResults ──
//!   poll: own probes done and the receiver's → Decided(verdict)
//!   (the caller moves the connection and rolls its transfer back)
//!   migrated(rail): Migrated ───────────────▶  (the receiver takes chunks on `rail`)
//! ```
//!
//! What the ends do with the verdict — which rail to move to, what to resend — is the
//! caller's (a collective's chunked rollback, a WR stream's resend): the state machine
//! only says when both ends know enough and what is to blame. Its IO is [`LocalizeIo`]:
//! posting this end's probes, reading their results, sending an out-of-band message.

use super::localize::{triangulate, Blame, Probes};
use super::oob::OobMsg;

/// What an end of a failed connection needs from its host.
pub trait LocalizeIo {
    /// Posts this end's probes on the failed rail: a zero-byte WRITE to the other end's
    /// NIC and one to a third node's.
    fn start_probes(&mut self);

    /// This end's probe results so far (`None` for a probe not completed yet).
    fn probe_results(&self) -> Probes;

    /// Sends `msg` to the other end over the out-of-band network.
    fn send_oob(&mut self, msg: OobMsg);
}

/// Which end of the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// The end whose QP reported the error: it decides.
    Sender,
    /// The other end: it probes when told and sends its results back.
    Receiver,
}

/// What [`Localization::poll`] says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Nothing new.
    Idle,
    /// The receiver sent its results.
    Reported,
    /// The sender decided: what the probes blame (`None`: every probe got through).
    Decided(Option<Blame>),
}

/// One end's part in localizing connection `conn`'s failure on `rail`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Localization {
    conn: u32,
    rail: u8,
    end: End,
    /// The receiver sent its results.
    reported: bool,
    /// The sender: the receiver's results.
    theirs: Option<Probes>,
    /// The sender: the verdict, once decided.
    verdict: Option<Option<Blame>>,
}

impl Localization {
    /// The sender's QP for `conn` on `rail` failed: it tells the receiver and probes.
    pub fn on_error(conn: u32, rail: u8, io: &mut impl LocalizeIo) -> Self {
        io.send_oob(OobMsg::ConnError { conn, rail });
        io.start_probes();
        Self::new(conn, rail, End::Sender)
    }

    /// The receiver heard that `conn` failed on `rail`: it probes too.
    pub fn on_notice(conn: u32, rail: u8, io: &mut impl LocalizeIo) -> Self {
        io.start_probes();
        Self::new(conn, rail, End::Receiver)
    }

    fn new(conn: u32, rail: u8, end: End) -> Self {
        Self {
            conn,
            rail,
            end,
            reported: false,
            theirs: None,
            verdict: None,
        }
    }

    /// The connection.
    pub fn conn(&self) -> u32 {
        self.conn
    }

    /// The rail it failed on.
    pub fn rail(&self) -> u8 {
        self.rail
    }

    /// Which end this is.
    pub fn end(&self) -> End {
        self.end
    }

    /// The sender's verdict, once decided.
    pub fn verdict(&self) -> Option<Option<Blame>> {
        self.verdict
    }

    /// True once this end's part is over: the sender decided, the receiver reported.
    pub fn finished(&self) -> bool {
        match self.end {
            End::Sender => self.verdict.is_some(),
            End::Receiver => self.reported,
        }
    }

    /// An out-of-band message about this connection from the other end: the sender keeps
    /// the receiver's results (the rest is the caller's: a notice makes a receiver's
    /// [`Localization`], a move is followed where the chunks are taken).
    pub fn on_oob(&mut self, msg: &OobMsg) {
        if let (End::Sender, OobMsg::ProbeResults { conn, probes, .. }) = (self.end, msg) {
            if *conn == self.conn {
                self.theirs = Some(*probes);
            }
        }
    }

    /// The next step when there is one: the receiver sends its results once both its
    /// probes completed; the sender decides once both its probes completed and the
    /// receiver's results came. Each happens once.
    pub fn poll(&mut self, io: &mut impl LocalizeIo) -> Progress {
        let ours = io.probe_results();
        let done = ours.to_peer.is_some() && ours.to_third.is_some();
        match self.end {
            End::Receiver if done && !self.reported => {
                self.reported = true;
                io.send_oob(OobMsg::ProbeResults {
                    conn: self.conn,
                    rail: self.rail,
                    probes: ours,
                });
                Progress::Reported
            }
            End::Sender if done && self.verdict.is_none() => {
                let Some(theirs) = self.theirs else {
                    return Progress::Idle;
                };
                let blamed = triangulate(ours, Some(theirs));
                self.verdict = Some(blamed);
                Progress::Decided(blamed)
            }
            _ => Progress::Idle,
        }
    }

    /// The sender moved the connection to `rail`: it tells the receiver.
    pub fn migrated(&self, rail: u8, io: &mut impl LocalizeIo) {
        io.send_oob(OobMsg::Migrated {
            conn: self.conn,
            rail,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One end's view: which probes it posted, their results, what it sent.
    #[derive(Default)]
    struct Io {
        probing: bool,
        results: Probes,
        sent: Vec<OobMsg>,
    }

    impl LocalizeIo for Io {
        fn start_probes(&mut self) {
            self.probing = true;
        }
        fn probe_results(&self) -> Probes {
            self.results
        }
        fn send_oob(&mut self, msg: OobMsg) {
            self.sent.push(msg);
        }
    }

    /// A dead ToR: neither end reaches the other or the third node. The exchange runs in
    /// order, each step once, and the sender blames the ToR.
    #[test]
    fn both_ends_probe_swap_results_and_the_sender_decides_once() {
        let (mut a_io, mut b_io) = (Io::default(), Io::default());
        let mut a = Localization::on_error(7, 0, &mut a_io);
        assert!(a_io.probing);
        assert_eq!(a_io.sent, [OobMsg::ConnError { conn: 7, rail: 0 }]);
        assert_eq!(a.poll(&mut a_io), Progress::Idle, "no probe done yet");

        let mut b = Localization::on_notice(7, 0, &mut b_io);
        assert!(b_io.probing && b_io.sent.is_empty());
        b_io.results.to_peer = Some(false);
        assert_eq!(b.poll(&mut b_io), Progress::Idle, "one probe still out");
        b_io.results.to_third = Some(false);
        assert_eq!(b.poll(&mut b_io), Progress::Reported);
        assert_eq!(b.poll(&mut b_io), Progress::Idle, "reported once");
        assert!(b.finished());
        let report = b_io.sent[0];

        a_io.results = Probes {
            to_peer: Some(false),
            to_third: Some(false),
        };
        assert_eq!(
            a.poll(&mut a_io),
            Progress::Idle,
            "the receiver's results not here"
        );
        a.on_oob(&OobMsg::ProbeResults {
            conn: 8,
            rail: 0,
            probes: Probes::default(),
        });
        assert_eq!(
            a.poll(&mut a_io),
            Progress::Idle,
            "another connection's results"
        );
        a.on_oob(&report);
        assert_eq!(a.poll(&mut a_io), Progress::Decided(Some(Blame::Tor)));
        assert_eq!(a.poll(&mut a_io), Progress::Idle, "decided once");
        assert_eq!(a.verdict(), Some(Some(Blame::Tor)));
        a.migrated(1, &mut a_io);
        assert_eq!(a_io.sent[1], OobMsg::Migrated { conn: 7, rail: 1 });
    }

    /// The receiver's NIC is dead: the sender reaches the third node but not the receiver,
    /// and the receiver reaches nobody.
    #[test]
    fn a_dead_receiver_nic_is_blamed_on_the_remote_end() {
        let (mut a_io, mut b_io) = (Io::default(), Io::default());
        let mut a = Localization::on_error(1, 0, &mut a_io);
        let mut b = Localization::on_notice(1, 0, &mut b_io);
        b_io.results = Probes {
            to_peer: Some(false),
            to_third: Some(false),
        };
        assert_eq!(b.poll(&mut b_io), Progress::Reported);
        a.on_oob(&b_io.sent[0]);
        a_io.results = Probes {
            to_peer: Some(false),
            to_third: Some(true),
        };
        assert_eq!(a.poll(&mut a_io), Progress::Decided(Some(Blame::RemoteNic)));
    }
}
