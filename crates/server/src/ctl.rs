//! `lepus ctl`: operates a running broker through its management HTTP API, as `rabbitmqctl` and
//! `rabbitmqadmin` do for RabbitMQ.

use serde_json::Value;
use std::time::Duration;

/// How long one HTTP request may take.
const REQUEST_TIMEOUT_S: u64 = 30;

/// `lepus ctl` options and command.
#[derive(clap::Args, Debug)]
pub struct CtlArguments {
    /// Base URL of the management HTTP API.
    #[arg(long, env = "LEPUS_CTL_URL", default_value = "http://127.0.0.1:15672")]
    url: String,
    /// User name.
    #[arg(long, env = "LEPUS_CTL_USER", default_value = "guest")]
    user: String,
    /// Password.
    #[arg(long, env = "LEPUS_CTL_PASSWORD", default_value = "guest")]
    password: String,
    #[command(subcommand)]
    command: CtlCommand,
}

#[derive(clap::Subcommand, Debug)]
enum CtlCommand {
    /// Shows the node, its totals and alarms.
    Status,
    /// Lists queues, exchanges, bindings or connections.
    List {
        /// What to list.
        #[arg(value_enum)]
        what: Listing,
        /// Only this vhost (all when omitted).
        #[arg(long)]
        vhost: Option<String>,
    },
    /// Closes a client connection (NAME as `lepus ctl list connections` shows it).
    CloseConnection {
        /// The connection's name.
        name: String,
        /// Why (sent to the client in connection.close).
        #[arg(long, default_value = "Closed via lepus ctl")]
        reason: String,
    },
    /// Writes the broker's definitions (RabbitMQ's JSON format) to FILE ("-" for stdout).
    ExportDefinitions {
        /// Where to write.
        file: String,
    },
    /// Imports definitions (RabbitMQ's JSON format) from FILE ("-" for stdin).
    ImportDefinitions {
        /// What to read.
        file: String,
    },
    /// Adds a user (or changes its password and tags).
    AddUser {
        /// Login name.
        name: String,
        /// Password.
        password: String,
        /// Comma-separated tags (administrator, monitoring, management, policymaker).
        #[arg(long, default_value = "")]
        tags: String,
    },
    /// Deletes a user and its permissions.
    DeleteUser {
        /// Login name.
        name: String,
    },
    /// Sets a user's configure, write and read regular expressions in a vhost.
    SetPermissions {
        /// Login name.
        user: String,
        /// Resources it may declare and delete.
        configure: String,
        /// Resources it may publish to and bind queues to.
        write: String,
        /// Resources it may consume from and bind from.
        read: String,
        /// The vhost.
        #[arg(long, default_value = "/")]
        vhost: String,
    },
    /// Adds a vhost (or changes its description); you get full permissions in it.
    AddVhost {
        /// The vhost's name.
        name: String,
        /// Free text shown in listings.
        #[arg(long, default_value = "")]
        description: String,
    },
    /// Deletes a vhost with everything in it, closing its connections.
    DeleteVhost {
        /// The vhost's name.
        name: String,
    },
    /// Sets a policy: queue settings for every queue whose name matches PATTERN.
    SetPolicy {
        /// The policy's name.
        name: String,
        /// Regular expression matched against queue (or exchange) names.
        pattern: String,
        /// The settings as a JSON object, e.g. '{"max-length": 1000, "overflow": "reject-publish"}'.
        definition: String,
        /// Among matching policies, the highest priority applies.
        #[arg(long, default_value_t = 0)]
        priority: i64,
        /// queues, exchanges or all.
        #[arg(long, default_value = "all")]
        apply_to: String,
        /// The vhost.
        #[arg(long, default_value = "/")]
        vhost: String,
    },
    /// Deletes a policy.
    ClearPolicy {
        /// The policy's name.
        name: String,
        /// The vhost.
        #[arg(long, default_value = "/")]
        vhost: String,
    },
    /// Lists users with their tags, or every permission.
    ListUsers,
    /// Lists every user's permissions.
    ListPermissions,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum Listing {
    Queues,
    Exchanges,
    Bindings,
    Connections,
    Channels,
    Vhosts,
    Policies,
}

struct Client {
    agent: ureq::Agent,
    base: String,
    authorization: String,
}

impl Client {
    fn new(arguments: &CtlArguments) -> Client {
        use base64::Engine;
        let credentials = base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", arguments.user, arguments.password));
        Client {
            agent: ureq::AgentBuilder::new().timeout(Duration::from_secs(REQUEST_TIMEOUT_S)).build(),
            base: arguments.url.trim_end_matches('/').to_string(),
            authorization: format!("Basic {credentials}"),
        }
    }

    fn request(&self, method: &str, path: &str, body: Option<&str>, headers: &[(&str, &str)]) -> Result<String, String> {
        let url = format!("{}/api{path}", self.base);
        let mut request = self.agent.request(method, &url).set("Authorization", &self.authorization);
        for (name, value) in headers {
            request = request.set(name, value);
        }
        let result = match body {
            Some(body) => request.set("Content-Type", "application/json").send_string(body),
            None => request.call(),
        };
        match result {
            Ok(response) => response.into_string().map_err(|error| format!("{method} {url}: reading the answer: {error}")),
            Err(ureq::Error::Status(code, response)) => {
                let text = response.into_string().unwrap_or_default();
                let reason = serde_json::from_str::<Value>(&text)
                    .ok()
                    .and_then(|value| value.get("reason").and_then(Value::as_str).map(str::to_string))
                    .unwrap_or(text);
                Err(format!("{method} {url}: HTTP {code}: {reason}"))
            }
            Err(error) => Err(format!("{method} {url}: {error}")),
        }
    }

    fn get_json(&self, path: &str) -> Result<Value, String> {
        let text = self.request("GET", path, None, &[])?;
        serde_json::from_str(&text).map_err(|error| format!("GET {path}: the answer is not JSON: {error}"))
    }
}

/// Percent-encodes one path segment (a vhost or object name).
fn segment(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (byte as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

fn cell(value: Option<&Value>) -> String {
    match value {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
    }
}

/// Prints rows of `columns` (dotted paths) as an aligned table.
fn print_table(items: &[Value], columns: &[&str]) {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|item| columns.iter().map(|column| cell(column.split('.').try_fold(item, |value, key| value.get(key)))).collect())
        .collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(index, column)| rows.iter().map(|row| row[index].len()).chain([column.len()]).max().unwrap_or(0))
        .collect();
    let line = |cells: Vec<String>| {
        cells.iter().zip(&widths).map(|(text, width)| format!("{text:<width$}")).collect::<Vec<_>>().join("  ").trim_end().to_string()
    };
    println!("{}", line(columns.iter().map(|column| column.to_string()).collect()));
    for row in rows {
        println!("{}", line(row));
    }
}

/// Runs one `lepus ctl` command; returns the exit code.
pub fn run(arguments: CtlArguments) -> i32 {
    match execute(&arguments) {
        Ok(()) => 0,
        Err(error) => {
            eprintln!("lepus ctl: {error}");
            1
        }
    }
}

fn execute(arguments: &CtlArguments) -> Result<(), String> {
    let client = Client::new(arguments);
    match &arguments.command {
        CtlCommand::Status => {
            let overview = client.get_json("/overview")?;
            let nodes = client.get_json("/nodes")?;
            let node = nodes.get(0).cloned().unwrap_or(Value::Null);
            println!("node: {}", cell(overview.get("node")));
            println!("version: {} {}", cell(overview.get("product_name")), cell(overview.get("product_version")));
            println!("uptime_ms: {}", cell(node.get("uptime")));
            for (label, path) in [
                ("connections", "object_totals.connections"),
                ("channels", "object_totals.channels"),
                ("queues", "object_totals.queues"),
                ("exchanges", "object_totals.exchanges"),
                ("consumers", "object_totals.consumers"),
                ("messages", "queue_totals.messages"),
                ("messages_ready", "queue_totals.messages_ready"),
                ("messages_unacknowledged", "queue_totals.messages_unacknowledged"),
            ] {
                println!("{label}: {}", cell(path.split('.').try_fold(&overview, |value, key| value.get(key))));
            }
            println!("memory_rss_bytes: {}", cell(node.get("mem_used")));
            println!("file_descriptors: {} / {}", cell(node.get("fd_used")), cell(node.get("fd_total")));
            println!("disk_free_bytes: {} (limit {})", cell(node.get("disk_free")), cell(node.get("disk_free_limit")));
            println!("disk_free_alarm: {}", cell(node.get("disk_free_alarm")));
            Ok(())
        }
        CtlCommand::List { what, vhost } => {
            let (path, columns): (&str, &[&str]) = match what {
                Listing::Queues => ("queues", &["vhost", "name", "durable", "messages_ready", "messages_unacknowledged", "consumers"]),
                Listing::Exchanges => ("exchanges", &["vhost", "name", "type", "durable", "auto_delete", "internal"]),
                Listing::Bindings => ("bindings", &["vhost", "source", "destination", "destination_type", "routing_key"]),
                Listing::Connections => ("connections", &["name", "user", "vhost", "channels", "client_properties.product"]),
                Listing::Channels => (
                    "channels",
                    &[
                        "name",
                        "user",
                        "vhost",
                        "number",
                        "confirm",
                        "transactional",
                        "prefetch_count",
                        "messages_unacknowledged",
                        "consumer_count",
                    ],
                ),
                Listing::Vhosts => ("vhosts", &["name", "description", "messages"]),
                Listing::Policies => ("policies", &["vhost", "name", "pattern", "apply-to", "priority", "definition"]),
            };
            let path = match (vhost, what) {
                (Some(vhost), Listing::Connections | Listing::Channels) => format!("/vhosts/{}/{path}", segment(vhost)),
                (Some(vhost), Listing::Vhosts) => format!("/vhosts/{}", segment(vhost)),
                (Some(vhost), _) => format!("/{path}/{}", segment(vhost)),
                (None, _) => format!("/{path}"),
            };
            let items = match client.get_json(&path)? {
                Value::Array(items) => items,
                single => vec![single],
            };
            print_table(&items, columns);
            Ok(())
        }
        CtlCommand::AddUser { name, password, tags } => {
            let body = serde_json::json!({"password": password, "tags": tags}).to_string();
            client.request("PUT", &format!("/users/{}", segment(name)), Some(&body), &[])?;
            println!("user '{name}' set");
            Ok(())
        }
        CtlCommand::DeleteUser { name } => {
            client.request("DELETE", &format!("/users/{}", segment(name)), None, &[])?;
            println!("user '{name}' deleted");
            Ok(())
        }
        CtlCommand::SetPermissions { user, configure, write, read, vhost } => {
            let body = serde_json::json!({"configure": configure, "write": write, "read": read}).to_string();
            client.request("PUT", &format!("/permissions/{}/{}", segment(vhost), segment(user)), Some(&body), &[])?;
            println!("permissions of '{user}' in '{vhost}' set");
            Ok(())
        }
        CtlCommand::AddVhost { name, description } => {
            let body = serde_json::json!({"description": description}).to_string();
            client.request("PUT", &format!("/vhosts/{}", segment(name)), Some(&body), &[])?;
            println!("vhost '{name}' set");
            Ok(())
        }
        CtlCommand::DeleteVhost { name } => {
            client.request("DELETE", &format!("/vhosts/{}", segment(name)), None, &[])?;
            println!("vhost '{name}' deleted");
            Ok(())
        }
        CtlCommand::SetPolicy { name, pattern, definition, priority, apply_to, vhost } => {
            let definition: Value = serde_json::from_str(definition).map_err(|error| format!("the definition is not JSON: {error}"))?;
            let body = serde_json::json!({"pattern": pattern, "definition": definition, "priority": priority, "apply-to": apply_to});
            client.request("PUT", &format!("/policies/{}/{}", segment(vhost), segment(name)), Some(&body.to_string()), &[])?;
            println!("policy '{name}' in '{vhost}' set");
            Ok(())
        }
        CtlCommand::ClearPolicy { name, vhost } => {
            client.request("DELETE", &format!("/policies/{}/{}", segment(vhost), segment(name)), None, &[])?;
            println!("policy '{name}' in '{vhost}' cleared");
            Ok(())
        }
        CtlCommand::ListUsers => {
            let users = client.get_json("/users")?;
            print_table(users.as_array().map(Vec::as_slice).unwrap_or(&[]), &["name", "tags"]);
            Ok(())
        }
        CtlCommand::ListPermissions => {
            let permissions = client.get_json("/permissions")?;
            print_table(permissions.as_array().map(Vec::as_slice).unwrap_or(&[]), &["user", "vhost", "configure", "write", "read"]);
            Ok(())
        }
        CtlCommand::CloseConnection { name, reason } => {
            client.request("DELETE", &format!("/connections/{}", segment(name)), None, &[("X-Reason", reason)])?;
            println!("closed {name}");
            Ok(())
        }
        CtlCommand::ExportDefinitions { file } => {
            let definitions = client.get_json("/definitions")?;
            let text = serde_json::to_string_pretty(&definitions).map_err(|error| error.to_string())?;
            if file == "-" {
                println!("{text}");
            } else {
                std::fs::write(file, format!("{text}\n")).map_err(|error| format!("{file}: {error}"))?;
                eprintln!("exported definitions to {file}");
            }
            Ok(())
        }
        CtlCommand::ImportDefinitions { file } => {
            let text = if file == "-" {
                std::io::read_to_string(std::io::stdin()).map_err(|error| format!("stdin: {error}"))?
            } else {
                std::fs::read_to_string(file).map_err(|error| format!("{file}: {error}"))?
            };
            serde_json::from_str::<Value>(&text).map_err(|error| format!("{file} is not JSON: {error}"))?;
            client.request("POST", "/definitions", Some(&text), &[])?;
            eprintln!("imported definitions from {file}");
            Ok(())
        }
    }
}
