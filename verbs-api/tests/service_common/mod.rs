//! What the service tests share: a service over a `loop` device, programs attached to it,
//! and a child program the kill tests start and kill.
#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ferroce_stack::transport::{
    bring_up, Access, AddressVector, Payload, QpAttr, QpCaps, QpState, QpType, SendWr,
    WorkCompletion, WrOpcode,
};
use ferroce_stack::wire::{MacAddr, Psn};
use ferroce_verbs::service::{Client, RemoteCq, RemoteMr, RemotePd, RemoteQp, Service};
use ferroce_verbs::spec::open_device;
use ferroce_verbs::Gid;

pub fn socket(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferroce-svc-{}-{name}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    dir.join("sock")
}

pub fn serve(name: &str) -> Service {
    let ctx = open_device("loop").expect("loop device");
    Service::start(vec![ctx], socket(name), 0o600).expect("service starts")
}

/// A page-aligned buffer: registrations move whole pages, so two programs' buffers in one
/// test process must not share one (the service refuses a page registered twice).
#[repr(C, align(4096))]
#[derive(Clone, Copy)]
pub struct Page(pub [u8; 4096]);

pub struct Buf(pub Vec<Page>);

impl Buf {
    pub fn new(len: usize) -> Self {
        Self(vec![Page([0; 4096]); len / 4096])
    }
    pub fn ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr().cast()
    }
    pub fn get(&self, at: usize) -> u8 {
        self.0[at / 4096].0[at % 4096]
    }
    pub fn set(&mut self, at: usize, v: u8) {
        self.0[at / 4096].0[at % 4096] = v;
    }
    pub fn range(&self, r: std::ops::Range<usize>) -> Vec<u8> {
        r.map(|i| self.get(i)).collect()
    }
    pub fn word(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.range(at..at + 8).try_into().unwrap())
    }
}

/// One program's objects: a buffer registered through the service, a CQ and an RC QP.
pub struct Program {
    pub client: Client,
    pub qp: RemoteQp,
    pub cq: RemoteCq,
    pub mr: RemoteMr,
    pub buf: Buf,
    pub _pd: RemotePd,
}

pub const LEN: usize = 64 << 10;

impl Program {
    pub fn new(svc: &Service) -> Self {
        Self::at(svc.socket())
    }

    pub fn at(socket: &std::path::Path) -> Self {
        let client = Client::connect(socket).expect("attach");
        assert_eq!(client.devices(), ["loop"]);
        let pd = client.alloc_pd(0).unwrap();
        let cq = client.create_cq(0, 256, None).unwrap();
        let mut buf = Buf::new(LEN);
        // SAFETY: `buf` outlives the registration (field order drops `mr` first... and the
        // test keeps both in one struct), and no other thread touches it while it moves.
        let mr = unsafe {
            pd.reg_mr(
                buf.ptr(),
                LEN,
                Access::LOCAL_WRITE
                    .with(Access::REMOTE_WRITE)
                    .with(Access::REMOTE_READ)
                    .with(Access::REMOTE_ATOMIC),
            )
        }
        .unwrap();
        let qp = pd
            .create_qp(QpType::Rc, QpCaps::default(), &cq, &cq, None)
            .unwrap();
        Self {
            client,
            qp,
            cq,
            mr,
            buf,
            _pd: pd,
        }
    }

    /// Its PD.
    pub fn _pd_ref(&self) -> &RemotePd {
        &self._pd
    }

    pub fn connect(&self, peer: &Self) {
        self.connect_qpn(peer.qp.qpn(), 14);
    }

    pub fn connect_qpn(&self, peer: ferroce_stack::wire::Qpn, timeout: u8) {
        let facts = self.client.query_device(0).unwrap();
        let port = &facts.ports[0];
        let ip = Gid(port.gid).ip();
        let attr = QpAttr {
            qp_access_flags: Access::REMOTE_WRITE
                .with(Access::REMOTE_READ)
                .with(Access::REMOTE_ATOMIC),
            ah_attr: AddressVector {
                smac: MacAddr(port.mac),
                dmac: MacAddr(port.mac),
                src: ip,
                dst: ip,
                ..AddressVector::default()
            },
            dest_qp_num: peer,
            timeout,
            retry_cnt: 3,
            rq_psn: Psn::new(100),
            sq_psn: Psn::new(100),
            ..QpAttr::default()
        };
        bring_up(QpType::Rc, &attr, |a, m| self.qp.modify(a, m)).unwrap();
        assert_eq!(self.qp.query().unwrap().qp_state, QpState::Rts);
    }

    pub fn wait(&self, n: usize) -> Vec<WorkCompletion> {
        let mut out = Vec::new();
        let until = Instant::now() + Duration::from_secs(10);
        while out.len() < n {
            let want = n - out.len();
            self.cq.poll(&mut out, want);
            assert!(
                Instant::now() < until,
                "only {} of {n} completions: {out:?}",
                out.len()
            );
            std::hint::spin_loop();
        }
        out
    }
}

pub fn pair(svc: &Service) -> (Program, Program) {
    let a = Program::new(svc);
    let b = Program::new(svc);
    a.connect(&b);
    b.connect(&a);
    (a, b)
}

/// Set for a child process of the kill tests: the service's socket.
pub const CHILD_ENV: &str = "FERROCE_SERVICE_TEST_CHILD";
/// Set with it: the peer QP to write to, as `qpn,addr,rkey`.
pub const CHILD_PEER_ENV: &str = "FERROCE_SERVICE_TEST_PEER";

/// The program the kill tests start and kill (each test binary runs it as its test
/// `child_program`, which does nothing unless [`CHILD_ENV`] is set). It attaches, registers
/// its buffer, fills it, connects its QP (to the peer it is given, or to itself), says
/// "ready", waits for a line on stdin, and writes until it is killed.
pub fn child_main() {
    let Some(socket) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let mut me = Program::at(std::path::Path::new(&socket));
    for i in 0..4096 {
        me.buf.set(i, 0x5a);
    }
    let (peer, addr, rkey) = match std::env::var(CHILD_PEER_ENV) {
        Ok(v) => {
            let f: Vec<u64> = v.split(',').map(|x| x.parse().unwrap()).collect();
            (
                ferroce_stack::wire::Qpn::new(f[0] as u32),
                f[1],
                f[2] as u32,
            )
        }
        Err(_) => (me.qp.qpn(), me.mr.addr() + 8192, me.mr.rkey()),
    };
    me.connect_qpn(peer, 14);
    println!("ready {}", me.qp.qpn().value());
    use std::io::Write as _;
    std::io::stdout().flush().unwrap();
    // Its peer connects its side first, then says go (end of input: the test has gone).
    let mut go = String::new();
    if std::io::stdin().read_line(&mut go).unwrap_or(0) == 0 {
        std::process::exit(0);
    }
    let sge = [me.mr.sge(0, 4096)];
    let mut out = Vec::new();
    for i in 0u64.. {
        // A test that failed before it killed this child leaves it to the service's end:
        // the service lives in the test's process.
        if me.client.is_gone() {
            std::process::exit(0);
        }
        let wr = SendWr::new(i, WrOpcode::Write, Payload::Sges(&sge)).remote(addr, rkey);
        let _ = me.qp.post_send(&[wr]);
        out.clear();
        me.cq.poll(&mut out, 16);
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// Starts `child_program` against `svc` (writing to `peer` if given) and waits for it to be
/// ready: its QP number. It starts writing when a line comes on its stdin
/// ([`go`]).
// The caller gets the child and kills and waits for it.
#[allow(clippy::zombie_processes)]
pub fn spawn_child(svc: &Service, peer: Option<String>) -> (std::process::Child, u32) {
    use std::io::BufRead as _;
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "child_program",
        "--nocapture",
        "--test-threads=1",
        "-q",
    ])
    .env(CHILD_ENV, svc.socket())
    .stdin(std::process::Stdio::piped())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::null());
    if let Some(p) = peer {
        cmd.env(CHILD_PEER_ENV, p);
    }
    let mut child = cmd.spawn().unwrap();
    let mut line = String::new();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    loop {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            let _ = child.wait();
            panic!("the child died before it was ready");
        }
        if let Some(q) = line.trim().strip_prefix("ready ") {
            return (child, q.parse().unwrap());
        }
    }
}

pub fn go(child: &mut std::process::Child) {
    use std::io::Write as _;
    let stdin = child.stdin.as_mut().unwrap();
    stdin.write_all(b"go\n").unwrap();
    stdin.flush().unwrap();
}

/// Mappings in this process (the service's shared memory among them).
pub fn maps() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .count()
}

pub fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

pub fn wait_sessions(svc: &Service, n: usize) {
    let until = Instant::now() + Duration::from_secs(10);
    while svc.sessions() != n {
        assert!(
            Instant::now() < until,
            "{} sessions, not {n}",
            svc.sessions()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}
