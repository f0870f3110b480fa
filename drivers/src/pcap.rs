//! A pcap tee for any port: standard pcap (LINKTYPE_ETHERNET) with nanosecond timestamps
//! from the port's own clock, so a simulated run gives a byte-identical file per seed.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferroce_stack::wire::{Span, SplitFrame};
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::{DataLink, Endianness, TsResolution};

use crate::{Port, TxError};

/// Which direction a tee records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Frames received and sent.
    Both,
    /// Frames received only.
    Rx,
    /// Frames sent only.
    Tx,
}

/// Opens a pcap writer with ferroce's header: nanosecond resolution, Ethernet link type,
/// little-endian, 65535-byte snap length.
pub fn writer<W: Write>(sink: W) -> Result<PcapWriter<W>, pcap_file::PcapError> {
    let header = PcapHeader {
        version_major: 2,
        version_minor: 4,
        ts_correction: 0,
        ts_accuracy: 0,
        snaplen: 65535,
        datalink: DataLink::ETHERNET,
        ts_resolution: TsResolution::NanoSecond,
        endianness: Endianness::Little,
    };
    PcapWriter::with_header(sink, header)
}

/// Appends one frame stamped `ts_ns` to a pcap writer.
pub fn write_frame<W: Write>(
    w: &mut PcapWriter<W>,
    ts_ns: u64,
    frame: &[u8],
) -> Result<(), pcap_file::PcapError> {
    let packet = PcapPacket::new(Duration::from_nanos(ts_ns), frame.len() as u32, frame);
    w.write_packet(&packet).map(|_| ())
}

/// One capture file several tees share (the queues of one port, each polled by its own
/// engine): give each tee a [`SharedCapture::sink`]. The file's header is written once, here;
/// each tee's records reach the file whole, one at a time, in the order they complete.
#[derive(Clone)]
pub struct SharedCapture {
    file: Arc<Mutex<Box<dyn Write + Send>>>,
}

impl SharedCapture {
    /// Starts a capture file in `sink` (buffer it: every record is one write).
    pub fn new(mut sink: Box<dyn Write + Send>) -> std::io::Result<Self> {
        let mut header = Vec::new();
        writer(&mut header).map_err(std::io::Error::other)?;
        sink.write_all(&header)?;
        Ok(Self {
            file: Arc::new(Mutex::new(sink)),
        })
    }

    /// A sink for one more [`PcapTee`]: it drops the file header the tee writes (the file
    /// has one) and holds each record's bytes until the record is whole.
    pub fn sink(&self) -> CaptureSink {
        CaptureSink {
            file: self.file.clone(),
            header_left: PCAP_HEADER_LEN,
            record: Vec::new(),
        }
    }
}

/// Bytes of a pcap file header and of a record header.
const PCAP_HEADER_LEN: usize = 24;
const RECORD_HEADER_LEN: usize = 16;

/// A [`PcapTee`]'s sink into a [`SharedCapture`].
pub struct CaptureSink {
    file: Arc<Mutex<Box<dyn Write + Send>>>,
    header_left: usize,
    record: Vec<u8>,
}

impl Write for CaptureSink {
    fn write(&mut self, mut buf: &[u8]) -> std::io::Result<usize> {
        let n = buf.len();
        let skip = self.header_left.min(buf.len());
        self.header_left -= skip;
        buf = &buf[skip..];
        while !buf.is_empty() {
            // The record's length once its header is in: 16 bytes, then the captured length
            // the header names (little-endian, as `writer` makes files).
            let len = |r: &[u8]| match r.get(8..12) {
                Some(c) => {
                    RECORD_HEADER_LEN + u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize
                }
                None => RECORD_HEADER_LEN,
            };
            let take = (len(&self.record) - self.record.len()).min(buf.len());
            self.record.extend_from_slice(&buf[..take]);
            buf = &buf[take..];
            if self.record.len() >= RECORD_HEADER_LEN && self.record.len() == len(&self.record) {
                let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
                file.write_all(&self.record)?;
                self.record.clear();
            }
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.lock().unwrap_or_else(|e| e.into_inner()).flush()
    }
}

/// Wraps a port and records its traffic. Write errors do not disturb the data path; the
/// first one is kept and reported by [`PcapTee::finish`].
pub struct PcapTee<P, W: Write> {
    inner: P,
    writer: PcapWriter<W>,
    direction: Direction,
    error: Option<pcap_file::PcapError>,
    frames: u64,
    /// A split frame assembled for the capture.
    scratch: Vec<u8>,
}

impl<P: Port, W: Write> PcapTee<P, W> {
    /// Starts recording `inner` into `sink` (a file, a `Vec<u8>`, ...).
    pub fn new(inner: P, sink: W, direction: Direction) -> Result<Self, pcap_file::PcapError> {
        Ok(Self {
            inner,
            writer: writer(sink)?,
            direction,
            error: None,
            frames: 0,
            scratch: Vec::new(),
        })
    }

    /// The wrapped port.
    pub fn inner(&self) -> &P {
        &self.inner
    }

    /// The wrapped port, mutably.
    pub fn inner_mut(&mut self) -> &mut P {
        &mut self.inner
    }

    /// Frames recorded so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Stops recording and returns the port and the sink, or the first write error.
    pub fn finish(self) -> Result<(P, W), pcap_file::PcapError> {
        match self.error {
            Some(e) => Err(e),
            None => Ok((self.inner, self.writer.into_writer())),
        }
    }

    fn record(
        writer: &mut PcapWriter<W>,
        error: &mut Option<pcap_file::PcapError>,
        frames: &mut u64,
        ts: u64,
        frame: &[u8],
    ) {
        if error.is_some() {
            return;
        }
        match write_frame(writer, ts, frame) {
            Ok(()) => *frames += 1,
            Err(e) => *error = Some(e),
        }
    }
}

impl<P: Port, W: Write> Port for PcapTee<P, W> {
    fn rx_burst<F: FnMut(&[u8])>(&mut self, max: usize, mut f: F) -> usize {
        let ts = self.inner.now_ns();
        let on = self.direction != Direction::Tx;
        let (writer, error, frames) = (&mut self.writer, &mut self.error, &mut self.frames);
        self.inner.rx_burst(max, |frame| {
            if on {
                Self::record(writer, error, frames, ts, frame);
            }
            f(frame)
        })
    }

    fn tx<F: FnOnce(&mut [u8])>(&mut self, len: usize, fill: F) -> Result<(), TxError> {
        let ts = self.inner.now_ns();
        let on = self.direction != Direction::Rx;
        let (writer, error, frames) = (&mut self.writer, &mut self.error, &mut self.frames);
        self.inner.tx(len, |buf| {
            fill(buf);
            if on {
                Self::record(writer, error, frames, ts, buf);
            }
        })
    }

    fn tx_split<S: Span>(&mut self, head: &[u8], frame: &SplitFrame<S>) -> Result<(), TxError> {
        if self.direction != Direction::Rx && self.error.is_none() {
            let ts = self.inner.now_ns();
            let mut copy = std::mem::take(&mut self.scratch);
            copy.resize(frame.len(), 0);
            frame.copy_to(head, &mut copy);
            Self::record(
                &mut self.writer,
                &mut self.error,
                &mut self.frames,
                ts,
                &copy,
            );
            self.scratch = copy;
        }
        self.inner.tx_split(head, frame)
    }

    fn rx_fd(&self) -> Option<std::os::fd::RawFd> {
        self.inner.rx_fd()
    }

    fn rx_arm(&mut self) {
        self.inner.rx_arm()
    }

    crate::port::forward_to_inner!();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file several writers share, readable after the capture ends.
    #[derive(Clone, Default)]
    struct File(Arc<Mutex<Vec<u8>>>);

    impl Write for File {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn tees_sharing_a_capture_write_one_header_and_whole_records() {
        let file = File::default();
        let capture = SharedCapture::new(Box::new(file.clone())).unwrap();
        let (mut a, mut b) = (
            writer(capture.sink()).unwrap(),
            writer(capture.sink()).unwrap(),
        );
        // A record of `a` arrives in pieces around a whole one of `b`, as two engine threads
        // may write them: each reaches the file whole, in the order it completed.
        let mut rec_a = Vec::new();
        write_frame(&mut writer(&mut rec_a).unwrap(), 7, &[0xaa; 100]).unwrap();
        let rec_a = &rec_a[PCAP_HEADER_LEN..];
        let mut sink_a = capture.sink();
        sink_a.write_all(&[0; PCAP_HEADER_LEN]).unwrap();
        sink_a.write_all(&rec_a[..10]).unwrap();
        write_frame(&mut b, 8, &[0xbb; 60]).unwrap();
        sink_a.write_all(&rec_a[10..50]).unwrap();
        write_frame(&mut a, 9, &[]).unwrap();
        sink_a.write_all(&rec_a[50..]).unwrap();
        write_frame(&mut b, 10, &[0xcc; 1500]).unwrap();
        drop((a, b, sink_a, capture));
        let bytes = file.0.lock().unwrap().clone();
        let mut r = pcap_file::pcap::PcapReader::new(&bytes[..]).unwrap();
        let mut got = Vec::new();
        while let Some(p) = r.next_packet() {
            let p = p.unwrap();
            got.push((
                p.timestamp.as_nanos() as u64,
                p.data.len(),
                p.data.first().copied(),
            ));
        }
        assert_eq!(
            got,
            [
                (8, 60, Some(0xbb)),
                (9, 0, None),
                (7, 100, Some(0xaa)),
                (10, 1500, Some(0xcc))
            ]
        );
    }
}
