//! The verbs layer's error: what libibverbs reports as an errno, with the reason in words.

use ferroce_stack::transport::{ModifyError, PostError, QpState};

/// A verbs-layer error (libibverbs reports these as errno values).
#[derive(Debug, thiserror::Error)]
pub enum VerbsError {
    /// Registration refused (bad access flags, wrapping range).
    #[error("memory registration failed: {0}")]
    Register(#[from] ferroce_stack::transport::RegisterError),
    /// `modify_qp` refused.
    #[error("modify_qp failed: {0}")]
    Modify(#[from] ModifyError),
    /// The object belongs to another context.
    #[error("{0} belongs to another device")]
    WrongDevice(&'static str),
    /// The QP is gone.
    #[error("QP {0:#x} does not exist")]
    NoSuchQp(u32),
    /// A GID index past the table.
    #[error("GID index {0} is out of range (the port's table has 16 entries, one in use)")]
    GidIndex(u32),
    /// A port number the device does not have.
    #[error("port {port} does not exist (the device has {ports}; ports count from 1)")]
    NoSuchPort {
        /// The port asked for.
        port: u8,
        /// Ports the device has.
        ports: u8,
    },
    /// The port could not map the registered memory for sending in place.
    #[error("memory registration failed: {0}")]
    Map(#[from] ferroce_drivers::MapError),
    /// The device specification could not be opened.
    #[error("{0}")]
    Open(String),
    /// No engine with that index.
    #[error("engine {engine} does not exist (the device has {engines})")]
    NoSuchEngine {
        /// The index asked for.
        engine: usize,
        /// How many the device has.
        engines: usize,
    },
    /// A CQ resized below the completions waiting in it.
    #[error("cannot resize the CQ to {cqe} entries: {waiting} completions wait in it")]
    CqTooSmall {
        /// The size asked for.
        cqe: usize,
        /// Completions waiting.
        waiting: usize,
    },
    /// What a context attached to a service cannot do.
    #[error("{0} is not available through the ferroce service")]
    NotThroughService(&'static str),
    /// The service refused, or has gone.
    #[error("{message}")]
    Service {
        /// The errno a C caller gets.
        errno: i32,
        /// Why.
        message: String,
    },
    /// A registration past the end of the shared memory it is in.
    #[error("{len} bytes at offset {offset} do not fit a shared region of {region} bytes")]
    OutsideRegion {
        /// Where it starts.
        offset: usize,
        /// Bytes.
        len: usize,
        /// The region's size.
        region: usize,
    },
    /// A reliability policy can only be set before the QP reaches RTR.
    #[error("set the reliability policy before RTR; the QP is in {0}")]
    PolicyAfterRtr(QpState),
}

/// A post that stopped at a bad WR: `index` of it in the list, and why (`bad_wr` in C).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("work request {index} refused: {error}")]
pub struct PostFailure {
    /// Index of the first refused WR; the ones before it were posted.
    pub index: usize,
    /// Why.
    pub error: PostError,
}
