//! What both ends of a connection are brought up with.

use ferroce_stack::transport::{Access, Mtu};

/// Connection parameters both ends of a pair use.
#[derive(Clone, Copy, Debug)]
pub struct ConnOpts {
    /// Path MTU.
    pub mtu: Mtu,
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout.
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries (7: infinite).
    pub rnr_retry: u8,
    /// RNR NAK timer code this end's responder sends.
    pub min_rnr_timer: u8,
    /// READ/atomic depth, both directions.
    pub max_rd_atomic: u8,
    /// Remote access each end grants.
    pub access: Access,
    /// Q_Key (UD).
    pub qkey: u32,
    /// UDP source port; `None` derives one from the QP numbers.
    pub udp_src_port: Option<u16>,
}

impl Default for ConnOpts {
    /// Short timers for virtual time: a 262 µs ACK timeout, the shortest RNR NAK timer.
    fn default() -> Self {
        Self {
            mtu: Mtu::Mtu1024,
            timeout: 6,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            max_rd_atomic: 8,
            access: Access::REMOTE_WRITE
                .with(Access::REMOTE_READ)
                .with(Access::REMOTE_ATOMIC),
            qkey: 0x1111_1111,
            udp_src_port: None,
        }
    }
}
