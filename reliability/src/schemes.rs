//! From names to policies: the one place a recovery, a path and a congestion scheme become
//! the [`Policies`] a QP runs. `ferroce perf` (after its connection exchange agreed),
//! the scenarios and the libibverbs drop-in (`FERROCE_SCHEME`, after rdma_cm's offers
//! agreed) all build their QPs' policies here, so a scheme means the same everywhere.
//!
//! What needs the peer's agreement is only the recovery scheme's wire (selective repeat's
//! opcodes and SACKs): whoever negotiates decides [`Schemes::recovery`] from both ends'
//! offers before calling [`Schemes::policies`]. Path choice and congestion control are the
//! sender's own.

use ferroce_stack::transport::{CongestionControl, PathSelector, Policies, Recovery};

use crate::cc::dcqcn::{Dcqcn, DcqcnConfig};
use crate::cc::timely::{Timely, TimelyConfig};
use crate::policy::baselines::{RnicSr, TimeoutOnly};
use crate::policy::gbn::GoBackN;
use crate::policy::spray::Spray;
use crate::policy::sr::{SelectiveRepeat, SrConfig};

/// A loss recovery scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecoveryScheme {
    /// IBTA Go-Back-N.
    GoBackN,
    /// ferroce's selective repeat (SACKs; both ends must run it).
    SelectiveRepeat,
    /// A ConnectX-style selective retransmission, the baseline of the spraying experiment.
    RnicSr,
    /// Resend on timeout only, the other baseline.
    TimeoutOnly,
}

/// How a QP spreads its packets over paths (UDP source ports).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathScheme {
    /// One path, as a ConnectX sends.
    Ecmp,
    /// Round robin by PSN over this many paths.
    Psn(u16),
    /// A random path of this many for each packet.
    Random(u16),
}

/// A congestion control scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CcScheme {
    /// DCQCN with ferroce's parameters.
    Dcqcn,
    /// DCQCN with ConnectX's (mlx5) parameters.
    DcqcnMlx5,
    /// TIMELY.
    Timely,
}

/// What a QP runs: each scheme, or `None` for the transport's default (one path, Go-Back-N,
/// no congestion control).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Schemes {
    /// Loss recovery.
    pub recovery: Option<RecoveryScheme>,
    /// Path choice.
    pub path: Option<PathScheme>,
    /// Congestion control.
    pub cc: Option<CcScheme>,
}

/// The numbers the schemes take from their setting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Params {
    /// The line rate, bit/s (congestion control's ceiling).
    pub line_bps: u64,
    /// The recovery window, packets (`None`: the scheme's default).
    pub window: Option<u32>,
    /// The base RTT, ns: DCQCN's rate-increase window and TIMELY's base (`None`: their
    /// defaults).
    pub rtt_ns: Option<u64>,
    /// The random path choice's seed.
    pub seed: u64,
}

/// Why a scheme string does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SchemeError {
    /// A word that names no scheme.
    #[error("'{0}' is not a scheme (recovery gbn, sr; paths spray[=N]; congestion dcqcn, dcqcn-mlx5, timely)")]
    Unknown(String),
    /// Two schemes of one kind.
    #[error("'{0}' names a second {1} scheme")]
    Twice(String, &'static str),
}

/// Paths `spray` uses when the string gives no number.
pub const DEFAULT_SPRAY_PATHS: u16 = 4;

impl Schemes {
    /// Everything at the transport's default: what a ConnectX runs.
    pub const IBTA: Self = Self {
        recovery: None,
        path: None,
        cc: None,
    };

    /// Reads a comma-separated list such as `sr,spray=4,dcqcn`: at most one word of each
    /// kind — recovery `gbn` or `sr`; paths `ecmp` or `spray[=N]` (round robin over N paths,
    /// 4 if not given); congestion `dcqcn`, `dcqcn-mlx5` or `timely`. Empty: [`IBTA`](Self::IBTA).
    pub fn parse(s: &str) -> Result<Self, SchemeError> {
        let mut out = Self::IBTA;
        for word in s.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            let taken = match word {
                "gbn" => out.recovery.replace(RecoveryScheme::GoBackN).is_some(),
                "sr" => out
                    .recovery
                    .replace(RecoveryScheme::SelectiveRepeat)
                    .is_some(),
                "ecmp" => out.path.replace(PathScheme::Ecmp).is_some(),
                "dcqcn" => out.cc.replace(CcScheme::Dcqcn).is_some(),
                "dcqcn-mlx5" => out.cc.replace(CcScheme::DcqcnMlx5).is_some(),
                "timely" => out.cc.replace(CcScheme::Timely).is_some(),
                w => {
                    let n = match w.strip_prefix("spray") {
                        Some("") => DEFAULT_SPRAY_PATHS,
                        Some(rest) => rest
                            .strip_prefix('=')
                            .and_then(|n| n.parse::<u16>().ok())
                            .filter(|&n| n >= 1)
                            .ok_or_else(|| SchemeError::Unknown(w.into()))?,
                        None => return Err(SchemeError::Unknown(w.into())),
                    };
                    out.path.replace(PathScheme::Psn(n)).is_some()
                }
            };
            if taken {
                return Err(SchemeError::Twice(word.into(), kind_of(word)));
            }
        }
        Ok(out)
    }

    /// The policies these schemes make with `p`.
    pub fn policies(&self, p: &Params) -> Policies {
        let recovery = self.recovery.map(|r| -> Box<dyn Recovery> {
            match r {
                RecoveryScheme::GoBackN => Box::new(match p.window {
                    Some(w) => GoBackN::with_window(w),
                    None => GoBackN::default(),
                }),
                RecoveryScheme::SelectiveRepeat => {
                    let mut config = SrConfig::default();
                    if let Some(w) = p.window {
                        config.window = w;
                    }
                    Box::new(SelectiveRepeat::new(config))
                }
                RecoveryScheme::RnicSr => {
                    Box::new(RnicSr::new(p.window.unwrap_or(SrConfig::default().window)))
                }
                RecoveryScheme::TimeoutOnly => Box::new(TimeoutOnly::new(
                    p.window.unwrap_or(SrConfig::default().window),
                )),
            }
        });
        let path = self.path.map(|s| -> Box<dyn PathSelector> {
            Box::new(match s {
                PathScheme::Ecmp => Spray::ecmp(),
                PathScheme::Psn(n) => Spray::psn(n),
                PathScheme::Random(n) => Spray::random(n, p.seed),
            })
        });
        let congestion = self.cc.map(|c| -> Box<dyn CongestionControl> {
            match c {
                CcScheme::Dcqcn => {
                    let mut config = DcqcnConfig::ferroce(p.line_bps);
                    if let Some(rtt) = p.rtt_ns {
                        config.window_rtt_ns = rtt;
                    }
                    Box::new(Dcqcn::new(config))
                }
                CcScheme::DcqcnMlx5 => Box::new(Dcqcn::new(DcqcnConfig::mlx5(p.line_bps))),
                CcScheme::Timely => {
                    let mut config = TimelyConfig::ferroce(p.line_bps);
                    if let Some(rtt) = p.rtt_ns {
                        config = config.with_base_rtt(rtt);
                    }
                    Box::new(Timely::new(config))
                }
            }
        });
        Policies {
            path,
            recovery,
            congestion,
        }
    }

    /// The schemes with `recovery` in place of the wanted one, as the peer's agreement
    /// allows: without selective repeat both ends, spraying is dropped too (a Go-Back-N
    /// receiver takes every reordered packet for a loss).
    pub fn agreed(&self, selective_repeat: bool) -> Self {
        if self.recovery == Some(RecoveryScheme::SelectiveRepeat) && !selective_repeat {
            return Self {
                recovery: None,
                path: None,
                cc: self.cc,
            };
        }
        *self
    }

    /// The comma-separated names, as [`parse`](Self::parse) reads them (`ibta` for none).
    pub fn name(&self) -> String {
        let mut v: Vec<String> = Vec::new();
        match self.recovery {
            Some(RecoveryScheme::GoBackN) => v.push("gbn".into()),
            Some(RecoveryScheme::SelectiveRepeat) => v.push("sr".into()),
            Some(RecoveryScheme::RnicSr) => v.push("rnic-sr".into()),
            Some(RecoveryScheme::TimeoutOnly) => v.push("timeout-only".into()),
            None => {}
        }
        match self.path {
            Some(PathScheme::Ecmp) => v.push("ecmp".into()),
            Some(PathScheme::Psn(n)) => v.push(format!("spray={n}")),
            Some(PathScheme::Random(n)) => v.push(format!("spray-random={n}")),
            None => {}
        }
        match self.cc {
            Some(CcScheme::Dcqcn) => v.push("dcqcn".into()),
            Some(CcScheme::DcqcnMlx5) => v.push("dcqcn-mlx5".into()),
            Some(CcScheme::Timely) => v.push("timely".into()),
            None => {}
        }
        if v.is_empty() {
            "ibta".into()
        } else {
            v.join(",")
        }
    }
}

/// The kind of scheme a word of [`Schemes::parse`] names.
fn kind_of(word: &str) -> &'static str {
    match word {
        "gbn" | "sr" => "recovery",
        "dcqcn" | "dcqcn-mlx5" | "timely" => "congestion",
        _ => "path",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_of_words_names_one_scheme_of_each_kind() {
        assert_eq!(Schemes::parse("").unwrap(), Schemes::IBTA);
        let s = Schemes::parse("sr, spray=8 ,dcqcn").unwrap();
        assert_eq!(s.recovery, Some(RecoveryScheme::SelectiveRepeat));
        assert_eq!(s.path, Some(PathScheme::Psn(8)));
        assert_eq!(s.cc, Some(CcScheme::Dcqcn));
        assert_eq!(s.name(), "sr,spray=8,dcqcn");
        assert_eq!(Schemes::parse(&s.name()).unwrap(), s);
        assert_eq!(
            Schemes::parse("spray").unwrap().path,
            Some(PathScheme::Psn(DEFAULT_SPRAY_PATHS))
        );
        assert_eq!(
            Schemes::parse("sr,gbn"),
            Err(SchemeError::Twice("gbn".into(), "recovery"))
        );
        assert_eq!(
            Schemes::parse("spray=0"),
            Err(SchemeError::Unknown("spray=0".into()))
        );
        assert_eq!(
            Schemes::parse("magic"),
            Err(SchemeError::Unknown("magic".into()))
        );
    }

    #[test]
    fn without_the_peers_selective_repeat_neither_it_nor_spraying_is_run() {
        let s = Schemes::parse("sr,spray=4,timely").unwrap();
        assert_eq!(s.agreed(true), s);
        let g = s.agreed(false);
        assert_eq!(
            (g.recovery, g.path, g.cc),
            (None, None, Some(CcScheme::Timely))
        );
        let p = g.policies(&Params::default());
        assert!(p.recovery.is_none() && p.path.is_none() && p.congestion.is_some());
    }
}
