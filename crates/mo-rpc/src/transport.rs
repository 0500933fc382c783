//! morpc over TCP: a multiplexed client connection (many requests in flight, answers matched
//! by request id) and a server loop. No TLS: the kernel's RPC has none.

use crate::error::RpcError;
use crate::frame::{self, FLAG_PING, FLAG_PONG, Frame};
use crate::service::Service;
use prost::Message;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// Limits of one connection.
#[derive(Clone, Debug)]
pub struct Options {
    /// Bounds every call: connecting, sending, and waiting for the answer. It is also the
    /// deadline sent to the kernel, which drops an answer whose deadline has passed.
    pub timeout: Duration,
    /// Largest body accepted (the kernel's default is 100 MiB).
    pub max_body: usize,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            timeout: Duration::from_secs(10),
            max_body: frame::DEFAULT_MAX_BODY,
        }
    }
}

type Waiters<R> = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<R, RpcError>>>>>;

struct Connection<S: Service> {
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    waiters: Waiters<S::Response>,
    broken: Arc<AtomicBool>,
    reader: tokio::task::JoinHandle<()>,
}

impl<S: Service> Drop for Connection<S> {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// One kernel service at one address. Connects on first use and again after a failure; one
/// TCP connection carries every call, as the kernel's own client does.
pub struct Endpoint<S: Service> {
    address: String,
    options: Options,
    connection: tokio::sync::Mutex<Option<Arc<Connection<S>>>>,
    next_id: AtomicU64,
    _service: PhantomData<S>,
}

impl<S: Service> Endpoint<S> {
    pub fn new(address: impl Into<String>, options: Options) -> Endpoint<S> {
        Endpoint {
            address: address.into(),
            options,
            connection: tokio::sync::Mutex::new(None),
            // The kernel's backends count from 1; 0 is never an id.
            next_id: AtomicU64::new(1),
            _service: PhantomData,
        }
    }

    pub fn address(&self) -> &str {
        &self.address
    }

    pub fn options(&self) -> &Options {
        &self.options
    }

    /// Sends `request` (its id is assigned here) and waits for the answer with that id.
    pub async fn call(&self, mut request: S::Request) -> Result<S::Response, RpcError> {
        let timeout = self.options.timeout;
        match tokio::time::timeout(timeout, self.call_inner(&mut request)).await {
            Ok(result) => result,
            Err(_) => {
                self.forget_waiter(S::request_id(&request)).await;
                Err(RpcError::Timeout {
                    address: self.address.clone(),
                    timeout,
                })
            }
        }
    }

    async fn call_inner(&self, request: &mut S::Request) -> Result<S::Response, RpcError> {
        let started = tokio::time::Instant::now();
        let connection = self.connection().await?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        S::set_request_id(request, id);
        let (tx, rx) = oneshot::channel();
        connection
            .waiters
            .lock()
            .expect("waiters lock")
            .insert(id, tx);
        // The deadline travels as the time left, as the kernel's codec computes it.
        let left = self.options.timeout.saturating_sub(started.elapsed());
        let frame = Frame::message(
            request.encode_to_vec(),
            left.as_nanos().clamp(1, i64::MAX as u128) as i64,
            S::PAYLOAD,
        );
        let bytes = frame::encode(&frame);
        let written = {
            let mut writer = connection.writer.lock().await;
            writer.write_all(&bytes).await
        };
        if let Err(e) = written {
            connection.broken.store(true, Ordering::Relaxed);
            connection.waiters.lock().expect("waiters lock").remove(&id);
            return Err(RpcError::ConnectionLost {
                address: self.address.clone(),
                detail: format!("writing: {e}"),
            });
        }
        match rx.await {
            Ok(result) => result,
            Err(_) => Err(RpcError::ConnectionLost {
                address: self.address.clone(),
                detail: "closed before answering".into(),
            }),
        }
    }

    async fn forget_waiter(&self, id: u64) {
        if let Some(connection) = self.connection.lock().await.as_ref() {
            connection.waiters.lock().expect("waiters lock").remove(&id);
        }
    }

    async fn connection(&self) -> Result<Arc<Connection<S>>, RpcError> {
        let mut slot = self.connection.lock().await;
        if let Some(c) = slot.as_ref()
            && !c.broken.load(Ordering::Relaxed)
        {
            return Ok(c.clone());
        }
        *slot = None;
        let stream = TcpStream::connect(&self.address)
            .await
            .map_err(|e| RpcError::Connect {
                address: self.address.clone(),
                detail: e.to_string(),
            })?;
        let _ = stream.set_nodelay(true);
        let (read, write) = stream.into_split();
        let waiters: Waiters<S::Response> = Arc::default();
        let broken = Arc::new(AtomicBool::new(false));
        let reader = tokio::spawn(read_answers::<S>(
            read,
            self.address.clone(),
            self.options.max_body.min(S::MAX_BODY),
            waiters.clone(),
            broken.clone(),
        ));
        let connection = Arc::new(Connection {
            writer: tokio::sync::Mutex::new(write),
            waiters,
            broken,
            reader,
        });
        *slot = Some(connection.clone());
        Ok(connection)
    }
}

/// Reads answers until the connection ends; each goes to the call waiting for its id. When
/// the connection fails every waiting call fails with it.
async fn read_answers<S: Service>(
    mut read: OwnedReadHalf,
    address: String,
    max_body: usize,
    waiters: Waiters<S::Response>,
    broken: Arc<AtomicBool>,
) {
    let mut frames = FrameReader::new(max_body);
    let failure = loop {
        let frame = match frames.next(&mut read).await {
            Ok(Some(frame)) => frame,
            Ok(None) => break "closed by the server".to_string(),
            Err(e) => break e,
        };
        if frame.flags & (FLAG_PING | FLAG_PONG) != 0 {
            continue; // keepalives carry no answer
        }
        let response = match S::Response::decode(frame.body.as_slice()) {
            Ok(r) => r,
            Err(e) => break format!("undecodable {} response: {e}", S::NAME),
        };
        let waiter = waiters
            .lock()
            .expect("waiters lock")
            .remove(&S::response_id(&response));
        // An answer nobody waits for (its call timed out) is dropped, as the kernel does.
        if let Some(waiter) = waiter {
            let _ = waiter.send(Ok(response));
        }
    };
    broken.store(true, Ordering::Relaxed);
    let waiting: Vec<_> = waiters.lock().expect("waiters lock").drain().collect();
    for (_, waiter) in waiting {
        let _ = waiter.send(Err(RpcError::ConnectionLost {
            address: address.clone(),
            detail: failure.clone(),
        }));
    }
}

/// Buffers a byte stream into frames; never holds more than one frame's worth (bounded by
/// the body limit) plus one read. An idle connection keeps a small buffer: an operator holds
/// one connection per kernel service of every pod it manages. A frame larger than
/// [`LARGE_FRAME`] is read only with its size reserved from [`FRAME_BUDGET`], shared by every
/// connection of the process: garbage lengths from many kernels at once cannot together hold
/// more than the budget (a reader waits its turn; its caller times out, which is uncertainty).
struct FrameReader {
    buffer: Vec<u8>,
    max_body: usize,
    reserved: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// Frames up to this size are read without a reservation.
pub const LARGE_FRAME: usize = 256 << 10;
/// Bytes of large frames all connections of the process may hold at once.
pub const FRAME_BUDGET: usize = 64 << 20;

fn frame_budget() -> Arc<tokio::sync::Semaphore> {
    static BUDGET: std::sync::OnceLock<Arc<tokio::sync::Semaphore>> = std::sync::OnceLock::new();
    BUDGET
        .get_or_init(|| Arc::new(tokio::sync::Semaphore::new(FRAME_BUDGET)))
        .clone()
}

/// What an idle connection's buffer shrinks back to after a large frame.
const IDLE_BUFFER: usize = 1 << 10;

impl FrameReader {
    fn new(max_body: usize) -> FrameReader {
        FrameReader {
            buffer: Vec::with_capacity(IDLE_BUFFER),
            max_body,
            reserved: None,
        }
    }

    /// The next frame; `None` at a clean end of stream.
    async fn next(&mut self, read: &mut OwnedReadHalf) -> Result<Option<Frame>, String> {
        loop {
            match frame::decode(&self.buffer, self.max_body) {
                Ok(Some((frame, used))) => {
                    self.buffer.drain(..used);
                    if self.buffer.is_empty() && self.buffer.capacity() > 4 * IDLE_BUFFER {
                        self.buffer = Vec::with_capacity(IDLE_BUFFER);
                    }
                    self.reserved = None;
                    return Ok(Some(frame));
                }
                Ok(None) => {}
                Err(e) => return Err(format!("bad frame: {e}")),
            }
            // The frame's length is known and within the limit: a large one waits for room.
            if self.reserved.is_none() && self.buffer.len() >= 4 {
                let announced = i32::from_be_bytes([
                    self.buffer[0],
                    self.buffer[1],
                    self.buffer[2],
                    self.buffer[3],
                ]) as usize;
                if announced > LARGE_FRAME {
                    let bytes = announced.min(FRAME_BUDGET) as u32;
                    let permit = frame_budget()
                        .acquire_many_owned(bytes)
                        .await
                        .map_err(|e| format!("frame budget: {e}"))?;
                    self.reserved = Some(permit);
                }
            }
            // Read into the buffer's spare room (no fixed chunk is kept in the task while it
            // waits); a full buffer doubles.
            if self.buffer.len() == self.buffer.capacity() {
                self.buffer.reserve(self.buffer.capacity().max(IDLE_BUFFER));
            }
            let n = read
                .read_buf(&mut self.buffer)
                .await
                .map_err(|e| format!("reading: {e}"))?;
            if n == 0 {
                return if self.buffer.is_empty() {
                    Ok(None)
                } else {
                    Err("connection ended inside a frame".into())
                };
            }
        }
    }
}

/// Answers one request. `None` means the service cannot answer at all (its process is down):
/// the server then closes the connection, as a dead process would.
pub trait Handler<S: Service>: Send + Sync + 'static {
    fn handle(&self, request: S::Request) -> Option<S::Response>;
}

impl<S: Service, F> Handler<S> for F
where
    F: Fn(S::Request) -> Option<S::Response> + Send + Sync + 'static,
{
    fn handle(&self, request: S::Request) -> Option<S::Response> {
        self(request)
    }
}

/// Serves `S` on `listener` until the task is dropped: frames in, the handler's answers out,
/// each with its request's id and the flags the kernel's server uses.
pub async fn serve<S: Service>(
    listener: TcpListener,
    handler: Arc<dyn Handler<S>>,
    max_body: usize,
) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors and the like: wait instead of spinning.
                tracing::warn!(service = S::NAME, error = %e, "accepting a connection failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            if let Err(e) = serve_connection::<S>(stream, handler, max_body).await {
                tracing::debug!(service = S::NAME, error = %e, "morpc connection ended");
            }
        });
    }
}

async fn serve_connection<S: Service>(
    stream: TcpStream,
    handler: Arc<dyn Handler<S>>,
    max_body: usize,
) -> Result<(), String> {
    let _ = stream.set_nodelay(true);
    let (mut read, mut write) = stream.into_split();
    let mut frames = FrameReader::new(max_body);
    while let Some(frame) = frames.next(&mut read).await? {
        if frame.flags & FLAG_PING != 0 {
            let id: [u8; 8] = frame.body.as_slice().try_into().map_err(|_| "bad ping")?;
            let pong = Frame::ping(u64::from_be_bytes(id), true, frame.timeout_ns.unwrap_or(0));
            write
                .write_all(&frame::encode(&pong))
                .await
                .map_err(|e| e.to_string())?;
            continue;
        }
        // The kernel's decoder refuses payload flags on types without one, and its handlers
        // need the deadline header: hold our peers to the same rules.
        if frame.payload.is_some() != S::PAYLOAD {
            return Err("payload flag does not match the message type".into());
        }
        let Some(timeout_ns) = frame.timeout_ns else {
            return Err("request without deadline header".into());
        };
        let request = S::Request::decode(frame.body.as_slice())
            .map_err(|e| format!("undecodable {} request: {e}", S::NAME))?;
        let id = S::request_id(&request);
        let Some(response) = handler.handle(request) else {
            return Ok(()); // the process is down: drop the connection
        };
        if S::response_id(&response) != id {
            return Err("handler answered with another request id".into());
        }
        let answer = Frame::message(response.encode_to_vec(), timeout_ns, S::PAYLOAD);
        write
            .write_all(&frame::encode(&answer))
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn frames_split_across_reads_decode_and_a_large_one_does_not_keep_its_buffer() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let large: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let bodies = vec![b"first".to_vec(), large, b"after".to_vec()];
        let wire: Vec<u8> = bodies
            .iter()
            .flat_map(|b| frame::encode(&Frame::message(b.clone(), 1_000, false)))
            .collect();
        let writer = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            // Odd-sized writes: frames arrive split at arbitrary points.
            for piece in wire.chunks(777) {
                socket.write_all(piece).await.expect("write");
                socket.flush().await.expect("flush");
            }
        });
        let stream = TcpStream::connect(address).await.expect("connect");
        let (mut read, _write) = stream.into_split();
        let mut frames = FrameReader::new(frame::DEFAULT_MAX_BODY);
        for body in &bodies {
            let frame = frames
                .next(&mut read)
                .await
                .expect("frame")
                .expect("not ended");
            assert_eq!(&frame.body, body);
        }
        assert!(
            frames.buffer.capacity() <= 4 * IDLE_BUFFER,
            "an idle reader keeps {} bytes",
            frames.buffer.capacity()
        );
        writer.await.expect("writer");
        assert!(frames.next(&mut read).await.expect("clean end").is_none());
    }
}
