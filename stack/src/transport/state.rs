//! QP states and the rules of `modify_qp` (IBTA Vol 1 §10.3, table 91 of QP attributes per
//! transition), as libibverbs and the Linux RDMA core enforce them: which state changes are
//! legal, which attributes a change must carry, and which it may carry. RC, UC and UD differ
//! only in the attribute sets. Anything not allowed is an error naming what is wrong, so a
//! verbs user sees `EINVAL`-style failures at the same places a ConnectX would give them.

use core::fmt;

/// A QP state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Just created, or reset: no traffic, no resources in use.
    Reset,
    /// Initialized: receives may be posted, nothing is processed.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drain: new send WRs are not started.
    Sqd,
    /// Send queue error (UC and UD): a send failed, receives still work.
    Sqe,
    /// Error: every outstanding WR is flushed.
    Err,
}

impl QpState {
    /// All states, in spec order.
    pub const ALL: [Self; 7] = [
        Self::Reset,
        Self::Init,
        Self::Rtr,
        Self::Rts,
        Self::Sqd,
        Self::Sqe,
        Self::Err,
    ];
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Reset => "RESET",
            Self::Init => "INIT",
            Self::Rtr => "RTR",
            Self::Rts => "RTS",
            Self::Sqd => "SQD",
            Self::Sqe => "SQE",
            Self::Err => "ERR",
        })
    }
}

/// The transport service of a QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable connection.
    Rc,
    /// Unreliable connection.
    Uc,
    /// Unreliable datagram.
    Ud,
}

/// Which attributes a `modify_qp` call sets, with libibverbs' `IBV_QP_*` bit values so a
/// mask from the C API maps one to one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AttrMask(pub u32);

flag_set!(AttrMask);

macro_rules! attrs {
    ($($(#[$m:meta])* $name:ident = $bit:expr;)+) => {
        impl AttrMask {
            $( $(#[$m])* pub const $name: Self = Self(1 << $bit); )+

            /// Every attribute's name and bit, for messages.
            const NAMES: &'static [(&'static str, u32)] = &[$((stringify!($name), 1 << $bit)),+];
        }
    };
}

attrs! {
    /// The target state.
    STATE = 0;
    /// The state the caller believes the QP is in.
    CUR_STATE = 1;
    /// Ask for an event when SQD drain completes.
    EN_SQD_ASYNC_NOTIFY = 2;
    /// Remote access rights (REMOTE_WRITE / READ / ATOMIC).
    ACCESS_FLAGS = 3;
    /// Partition key index.
    PKEY_INDEX = 4;
    /// Physical port.
    PORT = 5;
    /// Q_Key (UD).
    QKEY = 6;
    /// Address vector: the peer's GID, MAC and the path.
    AV = 7;
    /// Path MTU.
    PATH_MTU = 8;
    /// Local ACK timeout exponent.
    TIMEOUT = 9;
    /// Transport retry count.
    RETRY_CNT = 10;
    /// RNR retry count (7 = infinite).
    RNR_RETRY = 11;
    /// Expected receive PSN.
    RQ_PSN = 12;
    /// Outstanding READ/atomic requests this QP may issue.
    MAX_QP_RD_ATOMIC = 13;
    /// Alternate path.
    ALT_PATH = 14;
    /// Minimum RNR NAK timer.
    MIN_RNR_TIMER = 15;
    /// First send PSN.
    SQ_PSN = 16;
    /// Outstanding READ/atomic requests this QP accepts as responder.
    MAX_DEST_RD_ATOMIC = 17;
    /// Path migration state.
    PATH_MIG_STATE = 18;
    /// Queue capacities.
    CAP = 19;
    /// Destination QP number.
    DEST_QPN = 20;
}

impl AttrMask {
    /// No attribute.
    pub const NONE: Self = Self(0);

    /// Attributes in `self` and not in `o`.
    pub const fn without(self, o: Self) -> Self {
        Self(self.0 & !o.0)
    }

    /// True for the empty set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Display for AttrMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (name, bit) in Self::NAMES {
            if self.0 & bit != 0 {
                if !first {
                    f.write_str("|")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        if self.0 & !Self::NAMES.iter().fold(0, |a, (_, b)| a | b) != 0 {
            write!(
                f,
                "{}unknown bits {:#x}",
                if first { "" } else { "|" },
                self.0
            )?;
        }
        Ok(())
    }
}

/// Why a `modify_qp` was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ModifyError {
    /// The state change is not one the spec allows.
    #[error("{qp_type:?} QP cannot go from {from} to {to}")]
    IllegalTransition {
        /// The QP's type.
        qp_type: QpType,
        /// Its current state.
        from: QpState,
        /// The state asked for.
        to: QpState,
    },
    /// Attributes the transition requires are missing.
    #[error("{from} -> {to} needs {missing}")]
    MissingAttributes {
        /// Current state.
        from: QpState,
        /// Target state.
        to: QpState,
        /// What is missing.
        missing: AttrMask,
    },
    /// Attributes the transition does not accept are present.
    #[error("{from} -> {to} does not accept {extra}")]
    ExtraAttributes {
        /// Current state.
        from: QpState,
        /// Target state.
        to: QpState,
        /// What is not accepted.
        extra: AttrMask,
    },
    /// Only a UC QP takes a WRITE-with-immediate sink.
    #[error("a {0:?} QP cannot take a WRITE-with-immediate sink (UC only)")]
    NotUc(QpType),
    /// An alternate path needs a connected QP (RC or UC, RTR to SQD) and a port.
    #[error("a {0:?} QP in {1} cannot take an alternate path")]
    NoAlternatePath(QpType, QpState),
    /// Native failover resends atomics exactly once only if the peer keeps at least as many
    /// atomic results for replay as this QP keeps atomics outstanding.
    #[error(
        "max_rd_atomic {max_rd_atomic} exceeds the peer's max_dest_rd_atomic \
         {peer_max_dest_rd_atomic}: a resent atomic could run twice, so no alternate path"
    )]
    ReplayTooShallow {
        /// This QP's outstanding atomics.
        max_rd_atomic: u8,
        /// The peer's replay depth.
        peer_max_dest_rd_atomic: u8,
    },
}

/// Required and optional attributes of a legal transition, or `None` when it is illegal.
fn rule(t: QpType, from: QpState, to: QpState) -> Option<(AttrMask, AttrMask)> {
    use AttrMask as A;
    use QpState::{Init, Reset, Rtr, Rts, Sqd, Sqe};
    use QpType::{Rc, Uc, Ud};
    let none = A::NONE;
    let paths = A::ALT_PATH.with(A::PATH_MIG_STATE);
    Some(match (from, to) {
        // A QP that never left RESET has nothing to put in error.
        (Reset, QpState::Err) => return None,
        // Any other state may be reset or put in error; neither takes attributes.
        (_, Reset) | (_, QpState::Err) => (none, none),
        (Reset, Init) => match t {
            Ud => (A::PKEY_INDEX.with(A::PORT).with(A::QKEY), none),
            Rc | Uc => (A::PKEY_INDEX.with(A::PORT).with(A::ACCESS_FLAGS), none),
        },
        (Init, Init) => match t {
            Ud => (none, A::PKEY_INDEX.with(A::PORT).with(A::QKEY)),
            Rc | Uc => (none, A::PKEY_INDEX.with(A::PORT).with(A::ACCESS_FLAGS)),
        },
        (Init, Rtr) => {
            let conn = A::AV.with(A::PATH_MTU).with(A::DEST_QPN).with(A::RQ_PSN);
            let opt = A::ALT_PATH.with(A::ACCESS_FLAGS).with(A::PKEY_INDEX);
            match t {
                Ud => (none, A::PKEY_INDEX.with(A::QKEY)),
                Uc => (conn, opt),
                Rc => (conn.with(A::MAX_DEST_RD_ATOMIC).with(A::MIN_RNR_TIMER), opt),
            }
        }
        (Rtr, Rts) => match t {
            Ud => (A::SQ_PSN, A::CUR_STATE.with(A::QKEY)),
            Uc => (A::SQ_PSN, A::CUR_STATE.with(A::ACCESS_FLAGS).with(paths)),
            Rc => (
                A::SQ_PSN
                    .with(A::TIMEOUT)
                    .with(A::RETRY_CNT)
                    .with(A::RNR_RETRY)
                    .with(A::MAX_QP_RD_ATOMIC),
                A::CUR_STATE
                    .with(A::ACCESS_FLAGS)
                    .with(paths)
                    .with(A::MIN_RNR_TIMER),
            ),
        },
        (Rts, Rts) | (Sqd, Rts) => match t {
            Ud => (none, A::CUR_STATE.with(A::QKEY)),
            Uc => (none, A::CUR_STATE.with(A::ACCESS_FLAGS).with(paths)),
            Rc => (
                none,
                A::CUR_STATE
                    .with(A::ACCESS_FLAGS)
                    .with(paths)
                    .with(A::MIN_RNR_TIMER),
            ),
        },
        (Rts, Sqd) => (none, A::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => match t {
            Ud => (none, A::PKEY_INDEX.with(A::QKEY)),
            Uc => (
                none,
                A::AV.with(A::ACCESS_FLAGS).with(A::PKEY_INDEX).with(paths),
            ),
            Rc => (
                none,
                A::PORT
                    .with(A::AV)
                    .with(A::TIMEOUT)
                    .with(A::RETRY_CNT)
                    .with(A::RNR_RETRY)
                    .with(A::MAX_QP_RD_ATOMIC)
                    .with(A::MAX_DEST_RD_ATOMIC)
                    .with(A::ACCESS_FLAGS)
                    .with(A::PKEY_INDEX)
                    .with(A::MIN_RNR_TIMER)
                    .with(paths),
            ),
        },
        // SQE exists for UC and UD only: an RC send error takes the whole QP to ERR.
        (Sqe, Rts) => match t {
            Ud => (none, A::CUR_STATE.with(A::QKEY)),
            Uc => (none, A::CUR_STATE.with(A::ACCESS_FLAGS)),
            Rc => return None,
        },
        _ => return None,
    })
}

/// The smallest mask that takes a QP of type `t` from `from` to `to`: `STATE` plus the
/// attributes the transition requires, or `None` when the transition is illegal. Connection
/// setup code builds its three `modify` calls from this.
pub fn required_mask(t: QpType, from: QpState, to: QpState) -> Option<AttrMask> {
    rule(t, from, to).map(|(required, _)| required.with(AttrMask::STATE))
}

/// Checks a `modify_qp` from `from`. `mask` is the caller's attribute mask; a state change is
/// `STATE` in the mask with `to` the new state, and without `STATE` the QP stays in `from`
/// (an attribute-only modify, which only `from -> from` rules allow). `CAP` is never accepted:
/// ferroce, like libibverbs' providers, sizes queues only at creation.
pub fn check_modify(
    qp_type: QpType,
    from: QpState,
    to: QpState,
    mask: AttrMask,
) -> Result<(), ModifyError> {
    let to = if mask.contains(AttrMask::STATE) {
        to
    } else {
        from
    };
    let (required, optional) =
        rule(qp_type, from, to).ok_or(ModifyError::IllegalTransition { qp_type, from, to })?;
    let given = mask.without(AttrMask::STATE);
    let missing = required.without(given);
    if !missing.is_empty() {
        return Err(ModifyError::MissingAttributes { from, to, missing });
    }
    let extra = given.without(required).without(optional);
    if !extra.is_empty() {
        return Err(ModifyError::ExtraAttributes { from, to, extra });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use AttrMask as A;
    use QpState::{Init, Reset, Rtr, Rts, Sqd, Sqe};

    fn m(parts: &[AttrMask]) -> AttrMask {
        parts.iter().fold(A::STATE, |a, b| a.with(*b))
    }

    #[test]
    fn perftest_rc_bring_up_is_accepted() {
        // The masks perftest and ibv_rc_pingpong use, step by step.
        let init = m(&[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS]);
        let rtr = m(&[
            A::AV,
            A::PATH_MTU,
            A::DEST_QPN,
            A::RQ_PSN,
            A::MAX_DEST_RD_ATOMIC,
            A::MIN_RNR_TIMER,
        ]);
        let rts = m(&[
            A::TIMEOUT,
            A::RETRY_CNT,
            A::RNR_RETRY,
            A::SQ_PSN,
            A::MAX_QP_RD_ATOMIC,
        ]);
        assert_eq!(check_modify(QpType::Rc, Reset, Init, init), Ok(()));
        assert_eq!(check_modify(QpType::Rc, Init, Rtr, rtr), Ok(()));
        assert_eq!(check_modify(QpType::Rc, Rtr, Rts, rts), Ok(()));
        // UC takes the RC masks less the RD/atomic and timer attributes.
        assert_eq!(
            check_modify(
                QpType::Uc,
                Init,
                Rtr,
                m(&[A::AV, A::PATH_MTU, A::DEST_QPN, A::RQ_PSN])
            ),
            Ok(())
        );
        assert_eq!(check_modify(QpType::Uc, Rtr, Rts, m(&[A::SQ_PSN])), Ok(()));
        // UD: Q_Key at INIT, nothing at RTR, SQ PSN at RTS.
        assert_eq!(
            check_modify(
                QpType::Ud,
                Reset,
                Init,
                m(&[A::PKEY_INDEX, A::PORT, A::QKEY])
            ),
            Ok(())
        );
        assert_eq!(check_modify(QpType::Ud, Init, Rtr, A::STATE), Ok(()));
        assert_eq!(check_modify(QpType::Ud, Rtr, Rts, m(&[A::SQ_PSN])), Ok(()));
    }

    #[test]
    fn missing_and_extra_attributes_are_named() {
        let e = check_modify(QpType::Rc, Init, Rtr, m(&[A::AV, A::PATH_MTU, A::DEST_QPN]));
        assert_eq!(
            e,
            Err(ModifyError::MissingAttributes {
                from: Init,
                to: Rtr,
                missing: A::RQ_PSN.with(A::MIN_RNR_TIMER).with(A::MAX_DEST_RD_ATOMIC),
            })
        );
        assert_eq!(
            e.unwrap_err().to_string(),
            "INIT -> RTR needs RQ_PSN|MIN_RNR_TIMER|MAX_DEST_RD_ATOMIC"
        );
        let e = check_modify(
            QpType::Ud,
            Reset,
            Init,
            m(&[A::PKEY_INDEX, A::PORT, A::QKEY, A::ACCESS_FLAGS]),
        );
        assert_eq!(
            e,
            Err(ModifyError::ExtraAttributes {
                from: Reset,
                to: Init,
                extra: A::ACCESS_FLAGS
            })
        );
        assert!(check_modify(QpType::Rc, Rts, Rts, A::CAP).is_err());
    }

    #[test]
    fn legal_transitions_are_exactly_the_spec_graph() {
        // (from, to) pairs legal for some QP type, per IBTA figure 124 / table 91.
        let legal = |t: QpType, from: QpState, to: QpState| rule(t, from, to).is_some();
        for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
            for from in QpState::ALL {
                assert!(legal(t, from, Reset), "{t:?} {from} -> RESET");
                for to in QpState::ALL {
                    let expect = matches!(
                        (from, to),
                        (_, Reset)
                            | (Init | Rtr | Rts | Sqd | Sqe | QpState::Err, QpState::Err)
                            | (Reset, Init)
                            | (Init, Init | Rtr)
                            | (Rtr, Rts)
                            | (Rts, Rts | Sqd)
                            | (Sqd, Rts | Sqd)
                    ) || (from == Sqe && to == Rts && t != QpType::Rc);
                    assert_eq!(legal(t, from, to), expect, "{t:?} {from} -> {to}");
                }
            }
        }
        assert_eq!(
            check_modify(QpType::Rc, Reset, Rts, A::STATE),
            Err(ModifyError::IllegalTransition {
                qp_type: QpType::Rc,
                from: Reset,
                to: Rts
            })
        );
    }

    #[test]
    fn attribute_only_modify_stays_in_state() {
        // Without STATE the target is ignored: RTS -> RTS with an allowed attribute.
        assert_eq!(
            check_modify(QpType::Rc, Rts, Init, A::MIN_RNR_TIMER),
            Ok(())
        );
        // RTR -> RTR is not a legal modify.
        assert!(check_modify(QpType::Rc, Rtr, Rtr, A::MIN_RNR_TIMER).is_err());
    }
}
