//! A minimal XDP program on a tap, attached through a bpf link so that nothing stays attached
//! when the process goes away.
//!
//! The kernel's tun driver runs a tap's XDP program on the frames a user *writes* to the tap
//! fd (the path the VMM's virtio-net TX uses):
//!
//! - [`XdpProgram::Drop`] (`XDP_DROP`) makes a non-blocking writer's frames skip the skb path
//!   entirely, so the host stack costs nothing;
//! - [`XdpProgram::Reflect`] (`XDP_TX`) sends each written frame straight back to the same tap
//!   fd, where the writer (the VMM's RX path) reads it again.
//!
//! The program (`r0 = action; exit`) is loaded with the raw `bpf(2)` syscall
//! (`BPF_PROG_LOAD`) and attached with `BPF_LINK_CREATE` (Linux 5.9 or later). A bpf link that
//! is not pinned is detached by the kernel when its last fd closes: dropping the
//! [`XdpAttachment`] detaches, and so does the process dying in any way (error, Ctrl-C,
//! `SIGKILL`). Both fds are close-on-exec (the kernel creates them so), so a child process
//! never keeps the program attached.
//!
//! Interfaces are resolved in the network namespace of the *calling thread*: call [`attach`]
//! and [`attached_program`] from inside the namespace that holds the tap (for example in
//! `devices::test_utils::netns::NetNs::run`).

use std::ffi::CString;
use std::fmt;
use std::io;
use std::mem;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `BPF_PROG_LOAD` command of `bpf(2)`.
const BPF_PROG_LOAD: libc::c_long = 5;
/// `BPF_OBJ_GET_INFO_BY_FD` command of `bpf(2)`.
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
/// `BPF_LINK_CREATE` command of `bpf(2)`.
const BPF_LINK_CREATE: libc::c_long = 28;
/// `BPF_LINK_DETACH` command of `bpf(2)` (Linux 5.9+).
const BPF_LINK_DETACH: libc::c_long = 34;
/// `BPF_PROG_TYPE_XDP`.
const BPF_PROG_TYPE_XDP: u32 = 6;
/// `BPF_XDP`, the attach type of an XDP link.
const BPF_XDP: u32 = 37;
/// `XDP_FLAGS_SKB_MODE`: generic XDP, run on skbs by the core.
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
/// `XDP_DROP` return code.
const XDP_DROP: i32 = 1;
/// `XDP_TX` return code.
const XDP_TX: i32 = 3;
/// Verifier log buffer size used when a load fails and is retried with a log.
const LOG_SIZE: usize = 4096;

/// The XDP program to attach.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpProgram {
    /// `XDP_DROP`: frames written to the tap are dropped before an skb is built.
    Drop,
    /// `XDP_TX`: frames written to the tap are reflected back to the same tap fd.
    Reflect,
}

impl XdpProgram {
    /// The XDP action the program returns.
    fn action(self) -> i32 {
        match self {
            XdpProgram::Drop => XDP_DROP,
            XdpProgram::Reflect => XDP_TX,
        }
    }

    /// The program's name as printed to users: `xdp-drop` or `xdp-reflect`.
    pub fn name(self) -> &'static str {
        match self {
            XdpProgram::Drop => "xdp-drop",
            XdpProgram::Reflect => "xdp-reflect",
        }
    }

    /// The kernel object name (at most 15 characters, `[A-Za-z0-9_.]`).
    fn kernel_name(self) -> &'static [u8] {
        match self {
            XdpProgram::Drop => b"cotune_xdp_drop",
            XdpProgram::Reflect => b"cotune_xdp_tx",
        }
    }
}

impl fmt::Display for XdpProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How an XDP program is attached to an interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpMode {
    /// Driver (native) mode: the driver runs the program (tun: on written frames, before any
    /// skb is built).
    Native,
    /// Generic (skb) mode: the core runs the program on skbs.
    Generic,
    /// Offloaded to the NIC.
    Offload,
}

impl fmt::Display for XdpMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            XdpMode::Native => "native",
            XdpMode::Generic => "generic (skb)",
            XdpMode::Offload => "offload",
        })
    }
}

/// An XDP program attached to an interface through a bpf link. Dropping it detaches the
/// program at once (`BPF_LINK_DETACH`: a copy of the link fd that a concurrently forked child
/// holds until its `exec` would otherwise keep the link alive a little longer), then closes the
/// link and program fds (the link is never pinned); the kernel detaches too when the process
/// dies.
#[derive(Debug)]
pub struct XdpAttachment {
    // Declared first so that it is closed (detaching the program) before the program fd.
    link: OwnedFd,
    prog: OwnedFd,
    program: XdpProgram,
    ifname: String,
    ifindex: u32,
    mode: XdpMode,
    prog_id: u32,
}

impl XdpAttachment {
    /// The attached program.
    pub fn program(&self) -> XdpProgram {
        self.program
    }

    /// The interface's name.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// The interface's index (in the namespace it was attached in).
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// The mode the program runs in.
    pub fn mode(&self) -> XdpMode {
        self.mode
    }

    /// The kernel's id of the loaded program (what [`attached_program`] reports).
    pub fn prog_id(&self) -> u32 {
        self.prog_id
    }

    /// The bpf link fd (closing it detaches the program).
    pub fn link_fd(&self) -> RawFd {
        self.link.as_raw_fd()
    }

    /// The program fd.
    pub fn prog_fd(&self) -> RawFd {
        self.prog.as_raw_fd()
    }
}

impl Drop for XdpAttachment {
    fn drop(&mut self) {
        let mut attr = LinkDetachAttr {
            link_fd: self.link.as_raw_fd() as u32,
            _pad: [0; 60],
        };
        // SAFETY: `attr` is a BPF_LINK_DETACH attr with no pointers in it; the link fd is
        // open (owned by `self`) for the whole call.
        if let Err(e) = unsafe { bpf(BPF_LINK_DETACH, &mut attr) } {
            // Closing the fd below still detaches once the last copy of it is closed.
            log::warn!(
                "cannot detach {} from {}: {e}",
                self.program.name(),
                self.ifname
            );
        }
    }
}

/// The `BPF_LINK_DETACH` member of `union bpf_attr`, zero-padded.
#[repr(C, align(8))]
struct LinkDetachAttr {
    link_fd: u32,
    _pad: [u8; 60],
}

/// One eBPF instruction (`struct bpf_insn`).
#[repr(C)]
#[derive(Clone, Copy)]
struct BpfInsn {
    code: u8,
    /// `dst_reg` in the low nibble, `src_reg` in the high nibble.
    regs: u8,
    off: i16,
    imm: i32,
}

/// The `BPF_PROG_LOAD` member of `union bpf_attr`, zero-padded. A size smaller than the
/// kernel's union is fine (the kernel zero-fills the rest); a larger one must be zero beyond
/// the kernel's size, which the padding is.
#[repr(C, align(8))]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
    _pad: [u8; 56],
}

/// The `BPF_LINK_CREATE` member of `union bpf_attr`, zero-padded.
#[repr(C, align(8))]
struct LinkCreateAttr {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
    _pad: [u8; 48],
}

/// The `BPF_OBJ_GET_INFO_BY_FD` member of `union bpf_attr`, zero-padded.
#[repr(C, align(8))]
struct ObjInfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
    _pad: [u8; 48],
}

/// The first fields of `struct bpf_prog_info`.
#[repr(C)]
#[derive(Default)]
struct ProgInfoHead {
    prog_type: u32,
    id: u32,
}

/// `bpf(cmd, attr, size_of::<A>())`; the syscall's result (an fd or 0) or errno.
///
/// # Safety
///
/// `attr` must be the attr layout `cmd` expects, and every pointer in it must be valid for
/// what the kernel does with it during the call (read the instructions and license, write at
/// most `log_size` bytes of log, write at most `info_len` bytes of info).
unsafe fn bpf<A>(cmd: libc::c_long, attr: &mut A) -> io::Result<libc::c_long> {
    // SAFETY: the caller guarantees `attr` and the pointers in it are valid for `cmd`; the
    // size passed is exactly the size of `*attr`, which lives for the whole call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut A as *mut libc::c_void,
            mem::size_of::<A>() as libc::c_uint,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Takes ownership of an fd a successful `bpf(2)` returned.
fn owned_fd(ret: libc::c_long) -> OwnedFd {
    // SAFETY: `ret` is a fresh fd that bpf(2) just created for us (a successful
    // BPF_PROG_LOAD or BPF_LINK_CREATE returns a new fd); nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(ret as RawFd) }
}

/// Adds a hint about the usual cause of a `bpf(2)` failure to `err`.
fn bpf_error(what: &str, err: io::Error) -> io::Error {
    let hint = match err.raw_os_error() {
        Some(libc::ENOSYS) => " (this kernel has no bpf(2) syscall: CONFIG_BPF_SYSCALL is off)",
        Some(libc::EPERM) | Some(libc::EACCES) => {
            " (the bpf syscall was refused: loading and attaching XDP needs root, or CAP_BPF \
             and CAP_NET_ADMIN)"
        }
        _ => "",
    };
    io::Error::new(err.kind(), format!("{what}: {err}{hint}"))
}

/// Loads the program; on failure retries with a verifier log and puts the log in the error.
fn load(program: XdpProgram) -> io::Result<OwnedFd> {
    let insns = [
        // r0 = action (BPF_ALU64 | BPF_MOV | BPF_K)
        BpfInsn {
            code: 0xb7,
            regs: 0,
            off: 0,
            imm: program.action(),
        },
        // exit (BPF_JMP | BPF_EXIT)
        BpfInsn {
            code: 0x95,
            regs: 0,
            off: 0,
            imm: 0,
        },
    ];
    load_insns(&insns, program.kernel_name(), program.name())
}

/// Loads XDP program `insns` named `kernel_name` (at most 15 bytes); `what` names it in
/// errors.
fn load_insns(insns: &[BpfInsn], kernel_name: &[u8], what: &str) -> io::Result<OwnedFd> {
    let license = c"GPL";
    let mut log = vec![0u8; LOG_SIZE];
    let mut name = [0u8; 16];
    name[..kernel_name.len()].copy_from_slice(kernel_name);
    let attr = |log_level: u32, log: &mut [u8]| ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_XDP,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level,
        log_size: if log_level == 0 { 0 } else { log.len() as u32 },
        log_buf: if log_level == 0 {
            0
        } else {
            log.as_mut_ptr() as u64
        },
        kern_version: 0,
        prog_flags: 0,
        prog_name: name,
        prog_ifindex: 0,
        expected_attach_type: BPF_XDP,
        _pad: [0; 56],
    };
    let mut quiet = attr(0, &mut log);
    // SAFETY: `quiet` is a BPF_PROG_LOAD attr; `insns` (insn_cnt entries) and `license`
    // (NUL-terminated) outlive the call; no log buffer is given (log_level 0).
    match unsafe { bpf(BPF_PROG_LOAD, &mut quiet) } {
        Ok(fd) => return Ok(owned_fd(fd)),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) => {
            return Err(bpf_error("bpf(BPF_PROG_LOAD) of an XDP program", e));
        }
        Err(_) => {}
    }
    let mut logged = attr(1, &mut log);
    // SAFETY: as above, and `log` (log_size bytes, which the kernel writes at most) outlives
    // the call.
    let result = unsafe { bpf(BPF_PROG_LOAD, &mut logged) };
    match result {
        Ok(fd) => Ok(owned_fd(fd)),
        Err(e) => {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]);
            let text = text.trim();
            let err = bpf_error(&format!("bpf(BPF_PROG_LOAD) of {what}"), e);
            if text.is_empty() {
                Err(err)
            } else {
                Err(io::Error::new(
                    err.kind(),
                    format!("{err}; verifier log:\n{text}"),
                ))
            }
        }
    }
}

/// The kernel id of the program behind `prog`.
fn prog_id(prog: &OwnedFd) -> io::Result<u32> {
    let mut info = ProgInfoHead::default();
    let mut attr = ObjInfoAttr {
        bpf_fd: prog.as_raw_fd() as u32,
        info_len: mem::size_of::<ProgInfoHead>() as u32,
        info: &mut info as *mut ProgInfoHead as u64,
        _pad: [0; 48],
    };
    // SAFETY: `attr` is a BPF_OBJ_GET_INFO_BY_FD attr; the kernel writes at most `info_len`
    // bytes (the size of `info`, which outlives the call) of `struct bpf_prog_info`, whose
    // first two fields `ProgInfoHead` mirrors.
    unsafe { bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr) }
        .map_err(|e| bpf_error("bpf(BPF_OBJ_GET_INFO_BY_FD)", e))?;
    Ok(info.id)
}

/// `BPF_LINK_CREATE` of `prog` on `ifindex` with XDP `flags`.
fn link_create(prog: &OwnedFd, ifindex: u32, flags: u32) -> io::Result<OwnedFd> {
    let mut attr = LinkCreateAttr {
        prog_fd: prog.as_raw_fd() as u32,
        target_ifindex: ifindex,
        attach_type: BPF_XDP,
        flags,
        _pad: [0; 48],
    };
    // SAFETY: `attr` is a BPF_LINK_CREATE attr with no pointers in it.
    unsafe { bpf(BPF_LINK_CREATE, &mut attr) }.map(owned_fd)
}

/// Checks `ifname` is a possible interface name and resolves it in the calling thread's
/// network namespace.
fn ifindex(ifname: &str) -> io::Result<u32> {
    if ifname.is_empty() || ifname.len() >= libc::IFNAMSIZ || ifname.contains(['/', ' ']) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{ifname:?} is not a valid interface name"),
        ));
    }
    let c_name = CString::new(ifname).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{ifname:?} is not a valid interface name"),
        )
    })?;
    // SAFETY: `c_name` is a NUL-terminated string that outlives the call; if_nametoindex only
    // reads it.
    let index = unsafe { libc::if_nametoindex(c_name.as_ptr()) };
    if index == 0 {
        let e = io::Error::last_os_error();
        return Err(if e.raw_os_error() == Some(libc::ENODEV) {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("no interface named {ifname:?} in this network namespace"),
            )
        } else {
            io::Error::new(
                e.kind(),
                format!("cannot resolve interface {ifname:?}: {e}"),
            )
        });
    }
    Ok(index)
}

/// Loads `program` and attaches it to interface `ifname` (resolved in the calling thread's
/// network namespace) through a bpf link: in driver (native) mode, which taps support, else
/// in generic (skb) mode; [`XdpAttachment::mode`] says which.
///
/// Fails with a message naming the interface if it does not exist, if another XDP program is
/// attached to it, if the bpf syscall is refused (not root), or if the kernel is older than
/// 5.9 (no `BPF_LINK_CREATE` for XDP).
pub fn attach(ifname: &str, program: XdpProgram) -> io::Result<XdpAttachment> {
    let ifindex = ifindex(ifname)?;
    let prog = load(program)?;
    let id = prog_id(&prog)?;
    let (link, mut mode) = match link_create(&prog, ifindex, 0) {
        Ok(link) => (link, XdpMode::Native),
        Err(native) => {
            let fatal = matches!(
                native.raw_os_error(),
                Some(libc::EPERM | libc::EACCES | libc::EBUSY | libc::EEXIST | libc::ENODEV)
            );
            let skb = if fatal {
                Err(native)
            } else {
                link_create(&prog, ifindex, XDP_FLAGS_SKB_MODE).map_err(|skb| {
                    io::Error::new(
                        skb.kind(),
                        format!("native mode: {native}; generic (skb) mode: {skb}"),
                    )
                })
            };
            match skb {
                Ok(link) => (link, XdpMode::Generic),
                Err(e) => return Err(link_error(ifname, ifindex, program, e)),
            }
        }
    };
    // With flags 0 the kernel chooses generic mode itself for a driver without XDP support;
    // report what it actually did when the interface says.
    if let Ok(Some((attached, actual))) = query(ifindex) {
        if attached == id {
            mode = actual;
        }
    }
    Ok(XdpAttachment {
        link,
        prog,
        program,
        ifname: ifname.to_owned(),
        ifindex,
        mode,
        prog_id: id,
    })
}

/// The error of a failed `BPF_LINK_CREATE`, with the usual cause.
fn link_error(ifname: &str, ifindex: u32, program: XdpProgram, e: io::Error) -> io::Error {
    let hint = match e.raw_os_error() {
        Some(libc::EBUSY | libc::EEXIST) => {
            " (another XDP program is already attached to it; detach it first, e.g. \
             `ip link set dev IF xdp off`)"
        }
        Some(libc::EINVAL) => {
            " (a kernel older than 5.9 cannot attach XDP through BPF_LINK_CREATE; this one \
             refused the request)"
        }
        Some(libc::ENODEV) => " (the interface went away)",
        _ => "",
    };
    let err = bpf_error(
        &format!(
            "bpf(BPF_LINK_CREATE) of {} on {ifname:?} (ifindex {ifindex})",
            program.name()
        ),
        e,
    );
    io::Error::new(err.kind(), format!("{err}{hint}"))
}

/// The id of the XDP program attached to interface `ifname` (resolved in the calling thread's
/// network namespace), or `None` if none is. Asks the kernel by netlink (`RTM_GETLINK`,
/// `IFLA_XDP`).
pub fn attached_program(ifname: &str) -> io::Result<Option<u32>> {
    Ok(attached_program_mode(ifname)?.map(|(id, _)| id))
}

/// Like [`attached_program`], also telling the mode the program runs in.
pub fn attached_program_mode(ifname: &str) -> io::Result<Option<(u32, XdpMode)>> {
    let index = ifindex(ifname)?;
    query(index).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot query XDP state of {ifname:?} (ifindex {index}): {e}"),
        )
    })
}

// Netlink (NETLINK_ROUTE) constants, from linux/rtnetlink.h and linux/if_link.h.
const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const IFLA_XDP: u16 = 43;
const IFLA_XDP_ATTACHED: u16 = 2;
const IFLA_XDP_PROG_ID: u16 = 4;
const IFLA_XDP_SKB_PROG_ID: u16 = 5;
const IFLA_XDP_DRV_PROG_ID: u16 = 6;
const IFLA_XDP_HW_PROG_ID: u16 = 7;
const XDP_ATTACHED_DRV: u8 = 1;
const XDP_ATTACHED_SKB: u8 = 2;
const XDP_ATTACHED_HW: u8 = 3;
/// `NLA_TYPE_MASK`: the attribute type without `NLA_F_NESTED` / `NLA_F_NET_BYTEORDER`.
const NLA_TYPE_MASK: u16 = 0x3fff;

/// An `RTM_GETLINK` request: `struct nlmsghdr` then `struct ifinfomsg`.
#[repr(C)]
struct GetLinkRequest {
    nlmsg_len: u32,
    nlmsg_type: u16,
    nlmsg_flags: u16,
    nlmsg_seq: u32,
    nlmsg_pid: u32,
    ifi_family: u8,
    ifi_pad: u8,
    ifi_type: u16,
    ifi_index: i32,
    ifi_flags: u32,
    ifi_change: u32,
}

/// Size of `struct nlmsghdr`.
const NLMSG_HDRLEN: usize = 16;
/// Size of `struct ifinfomsg`.
const IFINFOMSG_LEN: usize = 16;

/// Asks the kernel (in the calling thread's network namespace) which XDP program is attached
/// to interface `index`, and in which mode.
fn query(index: u32) -> io::Result<Option<(u32, XdpMode)>> {
    // SAFETY: socket has no memory preconditions; the result is checked below.
    let raw = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is the new socket fd just created; nothing else owns it.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    let req = GetLinkRequest {
        nlmsg_len: mem::size_of::<GetLinkRequest>() as u32,
        nlmsg_type: RTM_GETLINK,
        nlmsg_flags: NLM_F_REQUEST,
        nlmsg_seq: 1,
        nlmsg_pid: 0,
        ifi_family: libc::AF_UNSPEC as u8,
        ifi_pad: 0,
        ifi_type: 0,
        ifi_index: index as i32,
        ifi_flags: 0,
        ifi_change: 0,
    };
    // SAFETY: `sock` is an open netlink socket (not yet bound: the kernel autobinds it and the
    // reply comes back to it) and `req` is valid for reads of its whole size during the call.
    let sent = unsafe {
        libc::send(
            sock.as_raw_fd(),
            &req as *const GetLinkRequest as *const libc::c_void,
            mem::size_of::<GetLinkRequest>(),
            0,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 64 * 1024];
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes during the call.
    let len = unsafe {
        libc::recv(
            sock.as_raw_fd(),
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
            0,
        )
    };
    if len < 0 {
        return Err(io::Error::last_os_error());
    }
    parse_link_reply(&buf[..len as usize])
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The attributes `(type, payload)` in `b` (a sequence of 4-aligned `struct rtattr`).
fn attributes(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < 4 {
            return None;
        }
        let len = u16_at(b, 0) as usize;
        let kind = u16_at(b, 2) & NLA_TYPE_MASK;
        if len < 4 || len > b.len() {
            return None;
        }
        let payload = &b[4..len];
        b = &b[((len + 3) & !3).min(b.len())..];
        Some((kind, payload))
    })
}

/// Parses the reply to an `RTM_GETLINK` request.
fn parse_link_reply(b: &[u8]) -> io::Result<Option<(u32, XdpMode)>> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "malformed netlink reply");
    if b.len() < NLMSG_HDRLEN {
        return Err(bad());
    }
    let msg_len = (u32_at(b, 0) as usize).min(b.len());
    match u16_at(b, 4) {
        NLMSG_ERROR => {
            if msg_len < NLMSG_HDRLEN + 4 {
                return Err(bad());
            }
            let errno = -(u32_at(b, NLMSG_HDRLEN) as i32);
            Err(io::Error::from_raw_os_error(errno))
        }
        RTM_NEWLINK => {
            if msg_len < NLMSG_HDRLEN + IFINFOMSG_LEN {
                return Err(bad());
            }
            let Some((_, xdp)) = attributes(&b[NLMSG_HDRLEN + IFINFOMSG_LEN..msg_len])
                .find(|&(kind, _)| kind == IFLA_XDP)
            else {
                return Ok(None);
            };
            let (mut attached, mut id, mut drv, mut skb, mut hw) = (0u8, 0, 0, 0, 0);
            for (kind, payload) in attributes(xdp) {
                match (kind, payload.len()) {
                    (IFLA_XDP_ATTACHED, 1..) => attached = payload[0],
                    (IFLA_XDP_PROG_ID, 4..) => id = u32_at(payload, 0),
                    (IFLA_XDP_SKB_PROG_ID, 4..) => skb = u32_at(payload, 0),
                    (IFLA_XDP_DRV_PROG_ID, 4..) => drv = u32_at(payload, 0),
                    (IFLA_XDP_HW_PROG_ID, 4..) => hw = u32_at(payload, 0),
                    _ => {}
                }
            }
            // One program: IFLA_XDP_ATTACHED gives its mode and IFLA_XDP_PROG_ID its id.
            // Several (XDP_ATTACHED_MULTI): report the driver one first.
            let found = match attached {
                0 => None,
                XDP_ATTACHED_DRV => Some((id, XdpMode::Native)),
                XDP_ATTACHED_SKB => Some((id, XdpMode::Generic)),
                XDP_ATTACHED_HW => Some((id, XdpMode::Offload)),
                _ => [
                    (drv, XdpMode::Native),
                    (skb, XdpMode::Generic),
                    (hw, XdpMode::Offload),
                ]
                .into_iter()
                .find(|&(id, _)| id != 0),
            };
            Ok(found)
        }
        other => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unexpected netlink message type {other}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use devices::test_utils::netns::NetNs;
    use std::fs::{File, OpenOptions};
    use std::io::{Read, Write};
    use std::os::unix::fs::OpenOptionsExt;
    use std::time::{Duration, Instant};

    fn is_root() -> bool {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        if !root {
            eprintln!("skipped: this test needs root (a network namespace, a tap, bpf)");
        }
        root
    }

    /// Opens (creating) tap `name` in the calling thread's namespace: `IFF_TAP | IFF_NO_PI`,
    /// no vnet header, non-blocking.
    fn open_tap(name: &str) -> io::Result<File> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")?;
        // SAFETY: ifreq is plain old data; all zeroes is a valid value.
        let mut req: libc::ifreq = unsafe { mem::zeroed() };
        for (dst, &src) in req.ifr_name.iter_mut().zip(name.as_bytes()) {
            *dst = src as libc::c_char;
        }
        req.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short;
        // SAFETY: `req` is a valid ifreq with a NUL-terminated name (the name is shorter than
        // IFNAMSIZ, the rest is zero) that outlives the call; TUNSETIFF reads it and writes
        // the name back within it.
        if unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut req) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(file)
    }

    /// A 64-byte Ethernet frame with a local EtherType and a recognisable payload.
    fn frame() -> Vec<u8> {
        let mut f = vec![0u8; 64];
        f[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x02]);
        f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
        f[12..14].copy_from_slice(&[0x88, 0xb5]);
        for (i, b) in f[14..].iter_mut().enumerate() {
            *b = i as u8 ^ 0x5a;
        }
        f
    }

    #[test]
    fn drop_attaches_and_detaches_on_drop() {
        if !is_root() {
            return;
        }
        let ns = NetNs::new("xdp-drop").unwrap();
        let (attached, mode, after) = ns
            .run(|| {
                let _tap = open_tap("xdptap0").unwrap();
                assert_eq!(attached_program("xdptap0").unwrap(), None);
                let guard = attach("xdptap0", XdpProgram::Drop).unwrap();
                let attached = attached_program_mode("xdptap0").unwrap();
                assert_eq!(attached.map(|(id, _)| id), Some(guard.prog_id()));
                let mode = guard.mode();
                drop(guard);
                (attached, mode, attached_program("xdptap0").unwrap())
            })
            .unwrap();
        assert!(attached.is_some());
        assert_eq!(attached.unwrap().1, mode);
        eprintln!("xdp-drop on a tap: {mode} mode");
        // tun has driver-mode XDP (ndo_bpf) on every kernel with XDP links (5.9+).
        assert_eq!(mode, XdpMode::Native);
        assert_eq!(
            after, None,
            "the program stayed attached after the guard dropped"
        );
    }

    #[test]
    fn reflect_returns_written_frame() {
        if !is_root() {
            return;
        }
        let ns = NetNs::new("xdp-reflect").unwrap();
        let run = {
            let tap = ns.run(|| open_tap("xdptap1")).unwrap().unwrap();
            ns.ip(&["link", "set", "xdptap1", "up"]).unwrap();
            ns.run(move || {
                let mut tap = tap;
                let sent = frame();
                let mut buf = [0u8; 2048];
                // Without the program the frame goes to the stack (which drops it: the
                // destination is not the tap's address) and never comes back.
                assert_eq!(tap.write(&sent)?, sent.len());
                let quiet = Instant::now() + Duration::from_millis(100);
                while Instant::now() < quiet {
                    match tap.read(&mut buf) {
                        Ok(n) => assert_ne!(buf[..n], sent[..], "reflected without XDP"),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(5))
                        }
                        Err(e) => return Err(e),
                    }
                }
                let guard = attach("xdptap1", XdpProgram::Reflect)?;
                assert_eq!(tap.write(&sent)?, sent.len());
                // The kernel may also send its own frames (IPv6 router solicitations, ...) out
                // of the tap once it is up: skip those.
                let deadline = Instant::now() + Duration::from_secs(2);
                loop {
                    match tap.read(&mut buf) {
                        Ok(n) if buf[..n] == sent[..] => break,
                        Ok(_) => {}
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            assert!(
                                Instant::now() < deadline,
                                "the written frame was not reflected ({} mode)",
                                guard.mode()
                            );
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        Err(e) => return Err(e),
                    }
                }
                Ok::<_, io::Error>(guard.mode())
            })
            .unwrap()
        };
        let mode = run.unwrap();
        eprintln!("xdp-reflect on a tap: {mode} mode");
    }

    #[test]
    fn missing_interface_is_named_in_the_error() {
        fn check() {
            let err = attach("nosuchtap9", XdpProgram::Drop).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::NotFound);
            assert!(err.to_string().contains("nosuchtap9"), "{err}");
            let err = attached_program("nosuchtap9").unwrap_err();
            assert!(err.to_string().contains("nosuchtap9"), "{err}");
        }
        // In a fresh namespace when possible, so that no interface of the host can match.
        match devices::test_utils::netns::in_netns(check) {
            Some(()) => {}
            None => check(),
        }
    }

    #[test]
    fn verifier_log_is_in_the_error() {
        if !is_root() {
            return;
        }
        // `exit` with r0 never written: the verifier refuses it.
        let insns = [BpfInsn {
            code: 0x95,
            regs: 0,
            off: 0,
            imm: 0,
        }];
        let err = load_insns(&insns, b"cotune_bad", "a bad program").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("a bad program"), "{text}");
        assert!(text.contains("verifier log:"), "{text}");
        assert!(text.contains("R0"), "{text}");
    }

    #[test]
    fn invalid_name_is_refused() {
        let err = attach("a/b", XdpProgram::Drop).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("a/b"), "{err}");
    }
}
