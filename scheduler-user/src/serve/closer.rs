//! Closing what clients hand abissd, off the loop that serves everyone.
//!
//! A close can wait as long as the object's owner likes: the last close of a TCP socket with
//! unsent data and `SO_LINGER` waits out the linger (issue 33: 18.8 s of root's `status` with a
//! 20 s linger, passed by `nobody` with a `hello`); every close of a FUSE file asks its server
//! to `flush`, and a server that never answers holds the closer in an uninterruptible sleep,
//! where even `SIGKILL` does not reach it. abissd runs its main loop and every connection on
//! one thread, so such a close there stops every stream's window and every client.
//!
//! So every descriptor a client passed ([`ClientFd`]), and every connection socket (which may
//! hold descriptors in flight that abissd never received), is closed by a thread of its user's
//! own: a stuck close holds up only that user's later closes. While one user has
//! [`MAX_CLOSING_PER_USER`] descriptors waiting, the server stops reading that user's
//! connections and refuses their new ones ([`Closer::is_stalled`]), so abissd holds no more of
//! theirs. The threads are [`KeyedThreads`], keyed by user.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use crate::serve::keyed_threads::KeyedThreads;

/// Descriptors of one user waiting to be closed (the one being closed included) beyond which
/// abissd takes no more from that user. Four connections' worth of waiting descriptors
/// (`MAX_PENDING_FDS`): a client that hangs up with everything it may hold is never stalled.
pub(crate) const MAX_CLOSING_PER_USER: usize = 16;

/// The closing threads, one per user with descriptors waiting (named `abiss-close`). Cloned
/// freely: every clone closes through the same threads.
#[derive(Clone, Debug)]
pub(crate) struct Closer {
    threads: KeyedThreads<u32, OwnedFd>,
}

impl Default for Closer {
    fn default() -> Self {
        Self::new()
    }
}

impl Closer {
    /// A closer with no thread yet.
    #[must_use]
    pub(crate) fn new() -> Self {
        Self {
            threads: KeyedThreads::new(
                "abiss-close",
                |_| lowest_cpu_priority(),
                |_, fd: OwnedFd| drop(fd),
            ),
        }
    }

    /// Closes `fd`, which user `uid` handed abissd, on that user's closing thread. Never
    /// waits for the close, and never closes anything on the caller's thread.
    pub(crate) fn close(&self, uid: u32, fd: OwnedFd) {
        self.threads.submit(uid, fd);
    }

    /// Closes a connection socket of `uid`'s. After a shutdown of both directions nothing
    /// more can arrive on it; if nothing is queued either, it holds no descriptor in flight
    /// and its close cannot wait, so it is closed here. Otherwise on the user's thread.
    pub(crate) fn close_connection(&self, uid: u32, socket: OwnedFd) {
        let _ = nix::sys::socket::shutdown(socket.as_raw_fd(), nix::sys::socket::Shutdown::Both);
        if queued_bytes(socket.as_fd()) == Some(0) {
            drop(socket);
        } else {
            self.close(uid, socket);
        }
    }

    /// Descriptors of `uid` handed over and not yet closed.
    #[must_use]
    pub(crate) fn pending(&self, uid: u32) -> usize {
        self.threads.pending(uid)
    }

    /// Whether `uid` has so many descriptors waiting to be closed that abissd takes no more
    /// from them (their connections are not read, new ones are refused).
    #[must_use]
    pub(crate) fn is_stalled(&self, uid: u32) -> bool {
        self.pending(uid) >= MAX_CLOSING_PER_USER
    }

    /// Closing threads running.
    #[must_use]
    #[cfg(test)]
    pub(crate) fn threads(&self) -> usize {
        self.threads.threads()
    }
}

/// The nice value of a closing thread: the lowest there is.
const CLOSING_NICE: libc::c_int = 19;

/// Puts the calling thread at the lowest CPU priority ([`CLOSING_NICE`]). What a user's object
/// does when it closes is that user's work, not abissd's: it must not compete for the CPUs with
/// the loop that serves everyone, nor run ahead of the user who passed it. A user who closes
/// their own copy right after passing it is then closing first on a busy machine, as on an idle
/// one; at the daemon's priority the closing thread woke at the hand-over and closed first in
/// 33 of about 208 tries beside two busy loops (eight runs of `tests/security_closes.rs`), at
/// the lowest in 6 of about 182. Failing, it logs and the thread keeps the priority it has.
fn lowest_cpu_priority() {
    let tid = nix::unistd::gettid().as_raw().unsigned_abs();
    // SAFETY: setpriority takes plain integers; for PRIO_PROCESS, Linux treats a thread id as
    // that thread alone.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, CLOSING_NICE) } != 0 {
        log::warn!(
            "cannot lower the CPU priority of a closing thread: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Bytes queued on a socket for reading (`SIOCINQ`), if the socket says.
fn queued_bytes(socket: BorrowedFd<'_>) -> Option<usize> {
    let mut queued: libc::c_int = 0;
    // SAFETY: FIONREAD (SIOCINQ) writes one int through the pointer, which lives on this frame.
    let done = unsafe { libc::ioctl(socket.as_raw_fd(), libc::FIONREAD, &raw mut queued) };
    (done == 0).then(|| usize::try_from(queued).unwrap_or(usize::MAX))
}

/// A descriptor a client passed: closed on its user's closing thread when it drops, so no
/// drop anywhere in abissd can wait on the client's object.
#[derive(Debug)]
pub(crate) struct ClientFd {
    fd: Option<OwnedFd>,
    uid: u32,
    closer: Closer,
}

impl ClientFd {
    /// `fd`, handed over by `uid`, to be closed through `closer`.
    #[must_use]
    pub(crate) fn new(fd: OwnedFd, uid: u32, closer: Closer) -> Self {
        Self {
            fd: Some(fd),
            uid,
            closer,
        }
    }

    /// The user who handed it over.
    #[must_use]
    pub(crate) fn uid(&self) -> u32 {
        self.uid
    }

    /// A duplicate, closed the same way.
    pub(crate) fn try_clone(&self) -> std::io::Result<Self> {
        Ok(self.same_owner(self.as_fd().try_clone_to_owned()?))
    }

    /// Another descriptor of the same object (the daemon's reopen of the client's file),
    /// closed the same way.
    #[must_use]
    pub(crate) fn same_owner(&self, fd: OwnedFd) -> Self {
        Self::new(fd, self.uid, self.closer.clone())
    }
}

impl AsFd for ClientFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd
            .as_ref()
            .map(AsFd::as_fd)
            .expect("a ClientFd holds its descriptor until it drops")
    }
}

impl AsRawFd for ClientFd {
    fn as_raw_fd(&self) -> RawFd {
        self.as_fd().as_raw_fd()
    }
}

impl Drop for ClientFd {
    fn drop(&mut self) {
        if let Some(fd) = self.fd.take() {
            self.closer.close(self.uid, fd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    fn settled(closer: &Closer, uid: u32, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while closer.pending(uid) > 0 {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    /// A TCP connection whose last close waits `linger_secs`: the peer never accepts, so its
    /// unsent data stays unsent. The listener must live as long as the wait should.
    fn lingering_socket(linger_secs: i32) -> (TcpListener, OwnedFd) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("listen");
        let mut stream =
            TcpStream::connect(listener.local_addr().expect("address")).expect("connect");
        stream.set_nonblocking(true).expect("nonblocking");
        let chunk = vec![0u8; 65536];
        while stream.write(&chunk).is_ok() {}
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: linger_secs,
        };
        nix::sys::socket::setsockopt(&stream, nix::sys::socket::sockopt::Linger, &linger)
            .expect("SO_LINGER");
        stream.set_nonblocking(false).expect("blocking");
        (listener, OwnedFd::from(stream))
    }

    #[test]
    fn a_close_that_waits_holds_up_neither_the_caller_nor_another_user() {
        let closer = Closer::new();
        let (_listener, socket) = lingering_socket(3);
        let started = Instant::now();
        drop(ClientFd::new(socket, 1000, closer.clone()));
        let (read, write) = nix::unistd::pipe().expect("pipe");
        drop(ClientFd::new(read, 1001, closer.clone()));
        drop(ClientFd::new(write, 1001, closer.clone()));
        assert!(
            started.elapsed() < Duration::from_millis(100),
            "the drops returned after {:?}",
            started.elapsed()
        );
        assert!(
            settled(&closer, 1001, Duration::from_secs(1)),
            "the other user's closes"
        );
        assert_eq!(closer.pending(1000), 1, "the lingering close still waits");
        assert!(!closer.is_stalled(1000), "one waiting close stalls nobody");
        assert!(
            settled(&closer, 1000, Duration::from_secs(6)),
            "the lingering close ends with its linger"
        );
    }

    /// The nice values of this process's closing threads (field 19 of their `stat`).
    fn closing_threads_nice() -> Vec<i32> {
        std::fs::read_dir("/proc/self/task")
            .expect("tasks")
            .filter_map(Result::ok)
            .filter(|task| {
                std::fs::read_to_string(task.path().join("comm"))
                    .is_ok_and(|comm| comm.trim() == "abiss-close")
            })
            .filter_map(|task| {
                let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
                let (_, fields) = stat.rsplit_once(") ")?;
                fields.split(' ').nth(16)?.parse().ok()
            })
            .collect()
    }

    #[test]
    fn a_closing_thread_runs_at_the_lowest_cpu_priority() {
        // SAFETY: getpriority takes plain integers; 0 is the calling process.
        let own = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        assert_ne!(
            own, CLOSING_NICE,
            "the premise: the tests run above nice 19"
        );
        let closer = Closer::new();
        let (listener, socket) = lingering_socket(5);
        closer.close(1002, socket);
        // A closing thread has its name before its first act lowers it (another test's may
        // have just started): each gets a moment.
        let mut nice = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(1);
        while Instant::now() < deadline {
            nice = closing_threads_nice();
            if !nice.is_empty() && nice.iter().all(|&n| n == CLOSING_NICE) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // The listener goes: the connection is reset and the close ends.
        drop(listener);
        assert!(!nice.is_empty(), "no closing thread while a close waits");
        assert!(
            nice.iter().all(|&n| n == CLOSING_NICE),
            "closing threads at nice {nice:?}"
        );
        assert!(settled(&closer, 1002, Duration::from_secs(6)));
    }

    #[test]
    fn a_user_with_too_many_closes_waiting_is_stalled() {
        let closer = Closer::new();
        let (_listener, socket) = lingering_socket(2);
        closer.close(1000, socket);
        for _ in 1..MAX_CLOSING_PER_USER {
            assert!(!closer.is_stalled(1000));
            closer.close(
                1000,
                OwnedFd::from(std::fs::File::open("/dev/null").expect("null")),
            );
        }
        assert!(closer.is_stalled(1000));
        assert!(!closer.is_stalled(1001), "only its own user");
        assert!(settled(&closer, 1000, Duration::from_secs(5)));
        assert!(!closer.is_stalled(1000));
    }

    #[test]
    fn an_empty_connection_socket_is_closed_in_place_and_a_loaded_one_on_the_users_thread() {
        let closer = Closer::new();
        let (ours, _theirs) = std::os::unix::net::UnixStream::pair().expect("pair");
        closer.close_connection(7, OwnedFd::from(ours));
        assert_eq!(closer.threads(), 0, "nothing queued: closed in place");
        let (ours, mut theirs) = std::os::unix::net::UnixStream::pair().expect("pair");
        theirs.write_all(b"x").expect("write");
        closer.close_connection(7, OwnedFd::from(ours));
        assert_eq!(
            closer.threads(),
            1,
            "something queued: on the user's thread"
        );
        assert!(settled(&closer, 7, Duration::from_secs(1)));
    }
}
