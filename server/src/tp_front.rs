//! The HTTP front of a tensor-parallel job started without `mpiexec`:
//! `server --tensor-parallel-size N` (`--distributed-executor-backend mp`,
//! the default, or `mpi`) run as a plain command starts the ranks itself
//! (`mpiexec -n N` of this same binary, rank 0 serving HTTP on a loopback
//! port) and forwards every request to rank 0, streaming the answers back.
//! This is the `mp` launch: the user starts one process, as with vLLM's
//! multiprocessing executor; unlike vLLM's it needs MPI installed (the
//! ranks' collectives are MPI's, and NCCL's between GPUs).
//!
//! Why a separate process: when one rank dies, MPICH's launcher SIGKILLs
//! every other rank within ~25 ms (each rank's process group; measured,
//! `-disable-auto-cleanup` included), so rank 0 cannot survive to answer
//! its clients. The front is not part of the MPI job: it sees rank 0's
//! connections break and answers them itself: a request whose answer had
//! not started gets a 500 with OpenAI's error body, a stream that had
//! started gets an SSE error event (its status is already 200); then the
//! front exits non-zero. `mpiexec` started by hand (the multi-node form)
//! keeps the old behaviour: the job ends and clients see their
//! connections close.
//!
//! The launcher is `mpiexec`, or the command in `$MPIEXEC` (split on
//! whitespace, e.g. `MPIEXEC="mpiexec -hosts a,b"`); the ranks get this
//! process's arguments with `--host`/`--port` replaced by a loopback port.
//!
//! Invariants:
//! - the front never outlives its job: when the job exits, the front stops
//!   accepting, gives open answers a short grace to end, and exits
//!   (non-zero unless it asked the job to stop);
//! - SIGINT/SIGTERM to the front reach the job as SIGTERM (rank 0 then
//!   drains and tells the other ranks to stop), and the front waits for it
//!   (bounded; SIGKILL after); a front that dies without cleaning up (even
//!   by SIGKILL) leaves the job a SIGTERM (Linux: `PR_SET_PDEATHSIG`).
//!
//! Cost: one loopback HTTP/1.1 connection per request, and a copy of each
//! body frame.

use crate::cli::ServeArgs;
use crate::error::ApiError;
use crate::http::{self, Body};
use anyhow::Context;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::CONTENT_TYPE;
use hyper::{Request, Response};
use std::convert::Infallible;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::process::ExitStatus;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::Notify;

/// Environment variables an MPI launcher sets in every rank (MPICH's
/// Hydra, Open MPI, PMIx).
const RANK_VARS: [&str; 3] = ["PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"];

/// How long a stopping job may take before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(15);

/// How long open answers get to end once the job has exited.
const ANSWER_GRACE: Duration = Duration::from_secs(3);

/// True when an MPI launcher started this process (it is a rank).
pub fn started_by_mpiexec() -> bool {
    RANK_VARS.iter().any(|v| std::env::var_os(v).is_some())
}

/// The ranks' arguments: this process's, with `--host`/`--port` (either
/// form) replaced by `127.0.0.1` and `port`.
fn rank_args(args: impl IntoIterator<Item = OsString>, port: u16) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut skip_value = false;
    for a in args {
        if std::mem::take(&mut skip_value) {
            continue;
        }
        let s = a.to_string_lossy();
        if s == "--host" || s == "--port" {
            skip_value = true;
            continue;
        }
        if s.starts_with("--host=") || s.starts_with("--port=") {
            continue;
        }
        out.push(a);
    }
    out.extend(["--host", "127.0.0.1", "--port"].map(OsString::from));
    out.push(port.to_string().into());
    out
}

/// What the handlers share.
struct Front {
    /// Rank 0's HTTP address.
    upstream: SocketAddr,
    /// Why the job is gone, once it is.
    gone: OnceLock<String>,
}

impl Front {
    /// The 500 of a request that rank 0 stopped answering.
    fn failed(&self, cause: &dyn std::fmt::Display) -> ApiError {
        let why = self.gone.get().map_or_else(
            || format!("a tensor-parallel rank stopped during the request ({cause})"),
            String::clone,
        );
        ApiError::Internal(format!("{why}; the server is exiting"))
    }
}

/// `server serve` as the front of an `N`-rank job (see the module docs).
pub fn run_front(args: &ServeArgs) -> anyhow::Result<()> {
    let n = args.engine.tensor_parallel_size;
    crate::app::http_runtime()?.block_on(async {
        let listener = crate::app::listen(&args.http).await?;
        let upstream = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let launcher = std::env::var("MPIEXEC").unwrap_or_else(|_| "mpiexec".into());
        let mut words = launcher.split_whitespace();
        let program = words.next().context("$MPIEXEC is empty")?;
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(words)
            .args(["-n", &n.to_string()])
            .arg(std::env::current_exe()?)
            .args(rank_args(std::env::args_os().skip(1), upstream.port()))
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        #[cfg(target_os = "linux")]
        // SAFETY: the closure runs in the forked child before exec and
        // only calls prctl(2), which is async-signal-safe.
        unsafe {
            // The job gets SIGTERM if the front dies, even by SIGKILL.
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let mut job = cmd
            .spawn()
            .with_context(|| format!("cannot start `{launcher}` (apt-get install mpich)"))?;
        tracing::info!(
            "tensor parallel size {n}: started `{launcher} -n {n}` (pid {}); serving at \
             http://{}/v1 once rank 0 is up",
            job.id().unwrap_or(0),
            listener.local_addr()?
        );
        let front = Arc::new(Front {
            upstream,
            gone: OnceLock::new(),
        });
        let stop = Arc::new(Notify::new());
        // Ends with whether the front asked the job to stop, and its status.
        let watcher = {
            let (front, stop) = (Arc::clone(&front), Arc::clone(&stop));
            async move {
                let exited = tokio::select! {
                    status = job.wait() => Some(status),
                    () = crate::app::shutdown_signal() => None,
                };
                let ended = match exited {
                    Some(status) => {
                        let text = status
                            .as_ref()
                            .map_or_else(|e| e.to_string(), |s| s.to_string());
                        let _ = front
                            .gone
                            .set(format!("the tensor-parallel job exited ({text})"));
                        (false, status.ok())
                    }
                    None => {
                        let _ = front.gone.set("the server is shutting down".into());
                        (true, stop_job(&mut job).await)
                    }
                };
                stop.notify_one();
                ended
            }
        };
        let watcher = tokio::spawn(watcher);
        let handler = move |req| forward(Arc::clone(&front), req);
        http::serve_with(listener, handler, stop.notified(), ANSWER_GRACE).await?;
        match watcher.await? {
            (true, _) => Ok(()),
            (false, Some(s)) => anyhow::bail!("the tensor-parallel job exited ({s})"),
            (false, None) => anyhow::bail!("the tensor-parallel job ended"),
        }
    })
}

/// SIGTERM to the job, then SIGKILL after [`STOP_GRACE`].
async fn stop_job(job: &mut tokio::process::Child) -> Option<ExitStatus> {
    if let Some(pid) = job.id().and_then(|p| i32::try_from(p).ok()) {
        // SAFETY: kill(2) with a pid of our own child (not yet reaped:
        // `id()` is `Some`) and a valid signal number; no memory involved.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
    match tokio::time::timeout(STOP_GRACE, job.wait()).await {
        Ok(s) => s.ok(),
        Err(_) => {
            let _ = job.kill().await;
            job.wait().await.ok()
        }
    }
}

/// Forwards one request to rank 0 and its answer back.
async fn forward(front: Arc<Front>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    if let Some(why) = front.gone.get() {
        return Ok(http::error_response(&ApiError::Unavailable(why.clone())));
    }
    let Ok(stream) = TcpStream::connect(front.upstream).await else {
        return Ok(http::error_response(&ApiError::Unavailable(
            "the tensor-parallel ranks are still loading the model".into(),
        )));
    };
    let _ = stream.set_nodelay(true);
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(io).await {
        Ok(pair) => pair,
        Err(e) => return Ok(http::error_response(&front.failed(&e))),
    };
    tokio::spawn(conn);
    let resp = match sender.send_request(req).await {
        Ok(r) => r,
        Err(e) => return Ok(http::error_response(&front.failed(&e))),
    };
    let (parts, body) = resp.into_parts();
    let sse = parts
        .headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    let frames = futures_util::stream::unfold(Some(body), move |body| {
        let front = Arc::clone(&front);
        async move {
            let mut body = body?;
            match body.frame().await? {
                Ok(frame) => Some((Ok(frame), Some(body))),
                // Rank 0 stopped mid-answer: a stream ends with an error
                // event; another body can only end short (the client sees
                // the connection close).
                Err(e) if sse => {
                    let event = crate::response::sse_error(&front.failed(&e).to_body());
                    Some((Ok(Frame::data(event)), None))
                }
                Err(_) => None,
            }
        }
    });
    let body: Body = StreamBody::new(frames).boxed_unsync();
    Ok(Response::from_parts(parts, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn ranks_get_the_same_flags_on_a_loopback_port() {
        let got = rank_args(
            args(&[
                "--model",
                "m.gguf",
                "--host",
                "0.0.0.0",
                "--port=9000",
                "--tensor-parallel-size",
                "2",
            ]),
            4321,
        );
        let want = args(&[
            "--model",
            "m.gguf",
            "--tensor-parallel-size",
            "2",
            "--host",
            "127.0.0.1",
            "--port",
            "4321",
        ]);
        assert_eq!(got, want);
        let got = rank_args(args(&["serve", "--port", "1", "--host=::"]), 7);
        assert_eq!(got, args(&["serve", "--host", "127.0.0.1", "--port", "7"]));
    }
}
