//! The management API client of `lepus ctl`, and its errors with rabbitmqctl's exit codes.

use serde_json::Value;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// How long the probe that tells an AMQP port from an HTTP one may take.
const PROBE_TIMEOUT_MS: u64 = 2000;

/// What went wrong, each with the exit code rabbitmqctl gives it (sysexits.h).
#[derive(Debug)]
pub enum CtlError {
    /// Bad arguments (EX_USAGE, 64).
    Usage(String),
    /// Input that is not what it should be (EX_DATAERR, 65).
    DataError(String),
    /// An input file that cannot be read (EX_NOINPUT, 66).
    NoInput(String),
    /// No broker answers, or it answers another protocol (EX_UNAVAILABLE, 69).
    Unavailable(String),
    /// The object does not exist (EX_UNAVAILABLE, 69, as `rabbitmqctl purge_queue` exits).
    NotFound(String),
    /// A health check found a problem (EX_UNAVAILABLE, 69).
    CheckFailed(String),
    /// The user named does not exist (EX_NOUSER, 67, as rabbitmqctl's user commands exit).
    NoUser(String),
    /// The broker failed a request it understood (EX_SOFTWARE, 70).
    Software(String),
    /// An output file that cannot be written (EX_CANTCREAT, 73).
    CannotCreate(String),
    /// Waiting ran out of time (EX_TEMPFAIL, 75).
    Timeout(String),
    /// Refused credentials or missing permission (EX_NOPERM, 77).
    NoPermission(String),
}

impl CtlError {
    /// rabbitmqctl's exit code for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            CtlError::Usage(_) => 64,
            CtlError::DataError(_) => 65,
            CtlError::NoInput(_) => 66,
            CtlError::NoUser(_) => 67,
            CtlError::Unavailable(_) | CtlError::NotFound(_) | CtlError::CheckFailed(_) => 69,
            CtlError::Software(_) => 70,
            CtlError::CannotCreate(_) => 73,
            CtlError::Timeout(_) => 75,
            CtlError::NoPermission(_) => 77,
        }
    }
}

impl std::fmt::Display for CtlError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (CtlError::Usage(text)
        | CtlError::DataError(text)
        | CtlError::NoInput(text)
        | CtlError::Unavailable(text)
        | CtlError::NotFound(text)
        | CtlError::CheckFailed(text)
        | CtlError::NoUser(text)
        | CtlError::Software(text)
        | CtlError::CannotCreate(text)
        | CtlError::Timeout(text)
        | CtlError::NoPermission(text)) = self;
        formatter.write_str(text)
    }
}

/// One management API, reached with basic authentication.
pub struct Client {
    agent: ureq::Agent,
    base: url::Url,
    authorization: String,
}

/// A JSON value as a table cell: strings bare, null empty, anything else as JSON.
pub fn text(value: Option<&Value>) -> String {
    match value {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
    }
}

/// Opens (and closes) a TCP connection to host:port.
pub fn connect_tcp(host: &str, port: u16) -> std::io::Result<()> {
    let address = (host, port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, format!("{host} has no address")))?;
    TcpStream::connect_timeout(&address, Duration::from_millis(PROBE_TIMEOUT_MS)).map(drop)
}

impl Client {
    /// A client for the API at `url`; a URL without a scheme is taken as `http://`.
    pub fn new(url: &str, user: &str, password: &str, timeout: Duration) -> Result<Client, CtlError> {
        use base64::Engine;
        let with_scheme = if url.contains("://") { url.to_string() } else { format!("http://{url}") };
        let base = url::Url::parse(with_scheme.trim_end_matches('/'))
            .map_err(|error| CtlError::Usage(format!("--url {url} is not a URL: {error}")))?;
        if base.host_str().is_none() {
            return Err(CtlError::Usage(format!("--url {url} names no host")));
        }
        let credentials = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        Ok(Client { agent: ureq::AgentBuilder::new().timeout(timeout).build(), base, authorization: format!("Basic {credentials}") })
    }

    /// The host the API is reached at (brackets stripped from an IPv6 address).
    pub fn host(&self) -> String {
        self.base.host_str().unwrap_or("127.0.0.1").trim_start_matches('[').trim_end_matches(']').to_string()
    }

    /// The API's port (the scheme's default when the URL names none).
    pub fn port(&self) -> u16 {
        self.base.port_or_known_default().unwrap_or(80)
    }

    /// `http` or `https`.
    pub fn scheme(&self) -> String {
        self.base.scheme().to_string()
    }

    fn shown_url(&self) -> String {
        format!("{}://{}:{}", self.base.scheme(), self.base.host_str().unwrap_or(""), self.port())
    }

    /// Sends one request to `/api{path}`; the answer's body on success.
    pub fn request(&self, method: &str, path: &str, body: Option<&str>, headers: &[(&str, &str)]) -> Result<String, CtlError> {
        let url = format!("{}/api{path}", self.base.as_str().trim_end_matches('/'));
        let mut request = self.agent.request(method, &url).set("Authorization", &self.authorization);
        for (name, value) in headers {
            request = request.set(name, value);
        }
        let result = match body {
            Some(body) => request.set("Content-Type", "application/json").send_string(body),
            None => request.call(),
        };
        match result {
            Ok(response) => {
                response.into_string().map_err(|error| CtlError::Unavailable(format!("{method} {url}: reading the answer: {error}")))
            }
            Err(ureq::Error::Status(code, response)) => Err(status_error(method, path, code, response)),
            Err(ureq::Error::Transport(transport)) => Err(self.transport_error(&transport)),
        }
    }

    /// A transport failure as the operator should read it: nobody listening, or an AMQP port.
    fn transport_error(&self, transport: &ureq::Transport) -> CtlError {
        let url = self.shown_url();
        if self.answers_amqp() {
            return CtlError::Unavailable(format!("{url} answers AMQP, not HTTP: point --url at the management port (15672 by default)"));
        }
        match transport.kind() {
            ureq::ErrorKind::ConnectionFailed | ureq::ErrorKind::Dns | ureq::ErrorKind::Io => CtlError::Unavailable(format!(
                "no broker answers at {url}; is it running? use --url to name its management API ({})",
                transport.message().map(str::to_string).unwrap_or_else(|| transport.kind().to_string())
            )),
            _ => CtlError::Unavailable(format!("{url} does not answer as a management API: {transport}")),
        }
    }

    /// Whether the port speaks AMQP: an AMQP 0-9-1 broker answers any bytes it cannot read as a
    /// protocol header with its own header, `AMQP` then four version bytes.
    fn answers_amqp(&self) -> bool {
        let probe = || -> std::io::Result<bool> {
            let address = (self.host().as_str(), self.port())
                .to_socket_addrs()?
                .next()
                .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no address"))?;
            let mut stream = TcpStream::connect_timeout(&address, Duration::from_millis(PROBE_TIMEOUT_MS))?;
            stream.set_read_timeout(Some(Duration::from_millis(PROBE_TIMEOUT_MS)))?;
            stream.write_all(b"GET / HTTP/1.0\r\n\r\n")?;
            let mut header = [0u8; 4];
            stream.read_exact(&mut header)?;
            Ok(&header == b"AMQP")
        };
        probe().unwrap_or(false)
    }

    /// GETs `/api{path}` and parses the answer.
    pub fn get_json(&self, path: &str) -> Result<Value, CtlError> {
        let text = self.request("GET", path, None, &[])?;
        serde_json::from_str(&text).map_err(|error| CtlError::Unavailable(format!("GET {path}: the answer is not JSON: {error}")))
    }

    /// The node's name, as its overview gives it.
    pub fn node(&self) -> Result<String, CtlError> {
        Ok(text(self.get_json("/overview")?.get("node")))
    }

    /// The resource alarms in effect, as `/api/health/checks/alarms` lists them.
    pub fn alarms(&self) -> Result<Vec<Value>, CtlError> {
        let url = format!("{}/api/health/checks/alarms", self.base.as_str().trim_end_matches('/'));
        let answer = match self.agent.get(&url).set("Authorization", &self.authorization).call() {
            Ok(response) => response,
            // The check answers 503 with the alarms in its body while one is in effect.
            Err(ureq::Error::Status(503, response)) => response,
            Err(ureq::Error::Status(code, response)) => return Err(status_error("GET", "/health/checks/alarms", code, response)),
            Err(ureq::Error::Transport(transport)) => return Err(self.transport_error(&transport)),
        };
        let body: Value = answer
            .into_json()
            .map_err(|error| CtlError::Unavailable(format!("GET /health/checks/alarms: the answer is not JSON: {error}")))?;
        Ok(body.get("alarms").and_then(Value::as_array).cloned().unwrap_or_default())
    }
}

fn status_error(method: &str, path: &str, code: u16, response: ureq::Response) -> CtlError {
    let body = response.into_string().unwrap_or_default();
    let reason = serde_json::from_str::<Value>(&body)
        .ok()
        .and_then(|value| value.get("reason").and_then(Value::as_str).map(str::to_string))
        .unwrap_or(body);
    let message = format!("{method} /api{path}: HTTP {code}: {reason}");
    match code {
        401 | 403 => CtlError::NoPermission(message),
        404 => CtlError::NotFound(message),
        400 => CtlError::DataError(message),
        _ => CtlError::Software(message),
    }
}
