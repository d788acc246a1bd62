//! `lepus ctl`: operates a running broker through its management HTTP API, as `rabbitmqctl`,
//! `rabbitmq-diagnostics` and `rabbitmqadmin` do for RabbitMQ. Command names are rabbitmqctl's
//! (`list_queues name messages`, `purge_queue`, `await_startup`, ...), with the dashed spellings
//! (`list-queues`, `list queues`) Lepus had before kept as aliases; `--formatter json` prints what
//! rabbitmqctl prints, and the exit codes are rabbitmqctl's (sysexits.h).

mod admin;
mod client;
mod cluster;
mod diagnostics;
mod listing;
mod queues;
mod topic_permissions;

use client::{Client, CtlError};
use listing::Listing;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// How long one HTTP request may take unless `--timeout` says otherwise.
const REQUEST_TIMEOUT_S: u64 = 30;
/// How long `await_startup` waits unless `--timeout` says otherwise (rabbitmqctl's default).
const AWAIT_STARTUP_TIMEOUT_S: u64 = 300;
/// How often `await_startup` asks again.
const AWAIT_STARTUP_POLL_MS: u64 = 200;

/// `lepus ctl` options and command.
#[derive(clap::Args, Debug)]
pub struct CtlArguments {
    /// Base URL of the management HTTP API (`http://` is assumed when the scheme is missing).
    #[arg(long, env = "LEPUS_CTL_URL", default_value = "http://127.0.0.1:15672", global = true)]
    url: String,
    /// User name.
    #[arg(long, env = "LEPUS_CTL_USER", default_value = "guest", global = true)]
    user: String,
    /// Password.
    #[arg(long, env = "LEPUS_CTL_PASSWORD", default_value = "guest", global = true)]
    password: String,
    /// The vhost (rabbitmqctl's `-p`); `/` when omitted.
    #[arg(short = 'p', long, global = true)]
    vhost: Option<String>,
    /// Output format: `table` (tab-separated, as rabbitmqctl prints) or `json` (as rabbitmqctl's).
    #[arg(long, value_enum, default_value = "table", global = true)]
    formatter: Formatter,
    /// Leaves out informational lines on stderr (rabbitmqctl's `-q`).
    #[arg(short = 'q', long, global = true)]
    quiet: bool,
    /// Leaves out the header line of tables.
    #[arg(long, global = true)]
    no_table_headers: bool,
    /// Seconds a command may take (`await_startup` waits this long; default 300 there, 30 elsewhere).
    #[arg(short = 't', long, global = true)]
    timeout: Option<u64>,
    #[command(subcommand)]
    command: CtlCommand,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq)]
enum Formatter {
    Table,
    Json,
}

/// Info keys to show (rabbitmqctl's columns); the listing's defaults when none are given.
#[derive(clap::Args, Debug)]
struct Columns {
    /// Columns, e.g. `name messages consumers`.
    columns: Vec<String>,
}

#[derive(clap::Subcommand, Debug)]
enum CtlCommand {
    /// Shows the node, its totals, listeners, memory watermark and alarms.
    Status,
    /// Exits 0 when the broker answers its management API, 69 when not.
    Ping,
    /// Shows the cluster's nodes (this one alone when not clustered), which run, their versions,
    /// listeners and alarms, as rabbitmqctl does; clustered, the metadata group's leader too.
    #[command(name = "cluster_status", alias = "cluster-status")]
    ClusterStatus,
    /// Shows the node's settings in force, as the configuration file names them.
    Environment,
    /// Everything an operator sends with a problem report: status, cluster status, settings,
    /// connections, channels, and each vhost's queues, exchanges, bindings, permissions, policies.
    Report,
    /// Waits (up to --timeout seconds) until the broker answers.
    #[command(name = "await_startup", alias = "await-startup")]
    AwaitStartup,
    /// Exits 69 when a resource alarm (memory or disk) is in effect.
    #[command(name = "check_alarms", alias = "check-alarms", alias = "check_local_alarms")]
    CheckAlarms,
    /// Connects to every listener the broker reports; exits 69 when one does not accept.
    #[command(name = "check_port_connectivity", alias = "check-port-connectivity")]
    CheckPortConnectivity,
    /// Lists queues, exchanges, bindings, connections, channels, consumers, users, vhosts,
    /// permissions or policies (also spelled `list_queues`, `list-queues`, ...).
    List {
        /// What to list.
        #[arg(value_enum)]
        what: Listing,
        #[command(flatten)]
        columns: Columns,
    },
    /// Lists queues: name messages (default), durable, auto_delete, arguments, consumers, ...
    #[command(name = "list_queues", alias = "list-queues")]
    ListQueues(Columns),
    /// Lists exchanges: name type (default), durable, auto_delete, internal, arguments, policy.
    #[command(name = "list_exchanges", alias = "list-exchanges")]
    ListExchanges(Columns),
    /// Lists bindings: source_name source_kind destination_name destination_kind routing_key arguments.
    #[command(name = "list_bindings", alias = "list-bindings")]
    ListBindings(Columns),
    /// Lists connections: user peer_host peer_port state (default), name, vhost, channels, ...
    #[command(name = "list_connections", alias = "list-connections")]
    ListConnections(Columns),
    /// Lists channels: pid user consumer_count messages_unacknowledged (default), ...
    #[command(name = "list_channels", alias = "list-channels")]
    ListChannels(Columns),
    /// Lists consumers: queue_name channel_pid consumer_tag ack_required prefetch_count active arguments.
    #[command(name = "list_consumers", alias = "list-consumers")]
    ListConsumers(Columns),
    /// Lists users with their tags.
    #[command(name = "list_users", alias = "list-users")]
    ListUsers(Columns),
    /// Lists vhosts.
    #[command(name = "list_vhosts", alias = "list-vhosts")]
    ListVhosts(Columns),
    /// Lists the permissions in the vhost.
    #[command(name = "list_permissions", alias = "list-permissions")]
    ListPermissions(Columns),
    /// Lists the policies in the vhost.
    #[command(name = "list_policies", alias = "list-policies")]
    ListPolicies(Columns),
    /// Removes every ready message of a queue.
    #[command(name = "purge_queue", alias = "purge-queue")]
    PurgeQueue {
        /// The queue's name.
        name: String,
    },
    /// Deletes a queue.
    #[command(name = "delete_queue", alias = "delete-queue")]
    DeleteQueue {
        /// The queue's name.
        name: String,
        /// Only when it has no consumers.
        #[arg(short = 'u', long)]
        if_unused: bool,
        /// Only when it holds no messages.
        #[arg(short = 'e', long)]
        if_empty: bool,
    },
    /// Closes a client connection (NAME as `lepus ctl list_connections name` shows it).
    #[command(name = "close_connection", alias = "close-connection")]
    CloseConnection {
        /// The connection's name.
        name: String,
        /// Why (sent to the client in connection.close).
        #[arg(default_value = "Closed via lepus ctl")]
        reason: String,
    },
    /// Writes the broker's definitions (RabbitMQ's JSON format) to FILE ("-" for stdout).
    #[command(name = "export_definitions", alias = "export-definitions")]
    ExportDefinitions {
        /// Where to write.
        file: String,
    },
    /// Imports definitions (RabbitMQ's JSON format) from FILE ("-" for stdin).
    #[command(name = "import_definitions", alias = "import-definitions")]
    ImportDefinitions {
        /// What to read.
        file: String,
    },
    /// Adds a user (or changes its password and tags).
    #[command(name = "add_user", alias = "add-user")]
    AddUser {
        /// Login name.
        name: String,
        /// Password. (Its own id: the global `--password` is the caller's.)
        #[arg(id = "new_user_password", value_name = "PASSWORD")]
        password: String,
        /// Comma-separated tags (administrator, monitoring, management, policymaker).
        #[arg(long, default_value = "")]
        tags: String,
    },
    /// Changes a user's password; its tags stay.
    #[command(name = "change_password", alias = "change-password")]
    ChangePassword {
        /// Login name.
        name: String,
        /// The new password.
        #[arg(id = "changed_password", value_name = "PASSWORD")]
        password: String,
    },
    /// Replaces a user's tags (none clears them); its password stays.
    #[command(name = "set_user_tags", alias = "set-user-tags")]
    SetUserTags {
        /// Login name.
        name: String,
        /// administrator, monitoring, management, policymaker, ... (space-separated).
        tags: Vec<String>,
    },
    /// Removes a user's permissions in the vhost (-p).
    #[command(name = "clear_permissions", alias = "clear-permissions")]
    ClearPermissions {
        /// Login name.
        #[arg(id = "unpermitted_user", value_name = "USER")]
        user: String,
    },
    /// Sets limits of the vhost (-p): '{"max-connections": 100, "max-queues": 1000}' (negative lifts one).
    #[command(name = "set_vhost_limits", alias = "set-vhost-limits")]
    SetVhostLimits {
        /// The limits as a JSON object.
        definition: String,
    },
    /// Lifts every limit of the vhost (-p).
    #[command(name = "clear_vhost_limits", alias = "clear-vhost-limits")]
    ClearVhostLimits,
    /// Deletes a user and its permissions.
    #[command(name = "delete_user", alias = "delete-user")]
    DeleteUser {
        /// Login name.
        name: String,
    },
    /// Sets a user's configure, write and read regular expressions in the vhost (-p).
    #[command(name = "set_permissions", alias = "set-permissions")]
    SetPermissions {
        /// Login name. (Its own id: the global `--user` is the caller's.)
        #[arg(id = "permitted_user", value_name = "USER")]
        user: String,
        /// Resources it may declare and delete.
        configure: String,
        /// Resources it may publish to and bind queues to.
        write: String,
        /// Resources it may consume from and bind from.
        read: String,
    },
    /// Sets a user's topic permission on an exchange in the vhost (-p): the routing keys it may
    /// publish with (WRITE) and bind with (READ), as regular expressions.
    #[command(name = "set_topic_permissions", alias = "set-topic-permissions")]
    SetTopicPermissions {
        /// Login name.
        #[arg(id = "topic_user", value_name = "USER")]
        user: String,
        /// The topic exchange.
        exchange: String,
        /// Routing keys it may publish with; `{username}` and `{vhost}` are replaced.
        write: String,
        /// Binding keys it may bind with; `{username}` and `{vhost}` are replaced.
        read: String,
    },
    /// Removes a user's topic permissions in the vhost (-p): on EXCHANGE, or on every exchange.
    #[command(name = "clear_topic_permissions", alias = "clear-topic-permissions")]
    ClearTopicPermissions {
        /// Login name.
        #[arg(id = "untopic_user", value_name = "USER")]
        user: String,
        /// The exchange (every exchange when omitted).
        exchange: Option<String>,
    },
    /// Lists the topic permissions in the vhost (-p).
    #[command(name = "list_topic_permissions", alias = "list-topic-permissions")]
    ListTopicPermissions,
    /// Lists a user's topic permissions in every vhost.
    #[command(name = "list_user_topic_permissions", alias = "list-user-topic-permissions")]
    ListUserTopicPermissions {
        /// Login name.
        #[arg(id = "listed_user", value_name = "USER")]
        user: String,
    },
    /// Adds a vhost (or changes its description); you get full permissions in it.
    #[command(name = "add_vhost", alias = "add-vhost")]
    AddVhost {
        /// The vhost's name.
        name: String,
        /// Free text shown in listings.
        #[arg(long, default_value = "")]
        description: String,
    },
    /// Deletes a vhost with everything in it, closing its connections.
    #[command(name = "delete_vhost", alias = "delete-vhost")]
    DeleteVhost {
        /// The vhost's name.
        name: String,
    },
    /// Sets a policy in the vhost (-p): queue settings for every queue whose name matches PATTERN.
    #[command(name = "set_policy", alias = "set-policy")]
    SetPolicy {
        /// The policy's name.
        name: String,
        /// Regular expression matched against queue (or exchange) names.
        pattern: String,
        /// The settings as a JSON object, e.g. '{"max-length": 1000, "overflow": "reject-publish"}'.
        definition: String,
        /// When several policies match, the highest priority applies.
        #[arg(long, default_value_t = 0)]
        priority: i64,
        /// queues, exchanges or all.
        #[arg(long, default_value = "all")]
        apply_to: String,
    },
    /// Deletes a policy from the vhost (-p).
    #[command(name = "clear_policy", alias = "clear-policy")]
    ClearPolicy {
        /// The policy's name.
        name: String,
    },
    /// The cluster: status, join, leave, forget.
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Quorum shard membership, as rabbitmq-queues: grow, shrink, add_member, delete_member.
    #[command(subcommand)]
    Queues(queues::QueuesCommand),
    /// Makes this node join the cluster at ADDRESS (host:port of a member's cluster port).
    #[command(name = "join_cluster", alias = "join-cluster")]
    JoinCluster {
        /// `host:port` of a member's cluster port.
        address: String,
    },
    /// Removes a member that is not running (rabbitmqctl's forget_cluster_node).
    #[command(name = "forget_cluster_node", alias = "forget-cluster-node")]
    ForgetClusterNode {
        /// The member's node name.
        node: String,
    },
}

/// Runs one `lepus ctl` command; returns rabbitmqctl's exit code for the outcome.
pub fn run(arguments: CtlArguments) -> i32 {
    // A reader that goes away (`lepus ctl report | head`) ends the command quietly, as it ends
    // rabbitmqctl, rather than making a print fail.
    // SAFETY: setting a signal's disposition to its default has no preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    match execute(&arguments) {
        Ok(()) => 0,
        Err(error) => {
            eprintln!("lepus ctl: {error}");
            error.exit_code()
        }
    }
}

impl CtlArguments {
    fn vhost(&self) -> &str {
        self.vhost.as_deref().unwrap_or("/")
    }

    /// Says on stderr what the command is about to do, unless `-q`.
    fn inform(&self, text: &str) {
        if !self.quiet {
            eprintln!("{text}");
        }
    }

    /// Prints a one-line outcome: the sentence for tables, `{"node":..,"result":"ok"}` for json.
    fn report(&self, node: &str, sentence: &str) {
        match self.formatter {
            Formatter::Table => println!("{sentence}"),
            Formatter::Json => println!("{}", json!({"node": node, "result": "ok"})),
        }
    }
}

fn execute(arguments: &CtlArguments) -> Result<(), CtlError> {
    let timeout_s = arguments.timeout.unwrap_or(REQUEST_TIMEOUT_S);
    let client = Client::new(&arguments.url, &arguments.user, &arguments.password, Duration::from_secs(timeout_s))?;
    if let Some((listing, columns)) = listing_command(&arguments.command) {
        return listing::list(&client, arguments, listing, columns);
    }
    match &arguments.command {
        CtlCommand::Status => status(&client, arguments),
        CtlCommand::Cluster(command) => cluster::run(&client, arguments, command),
        CtlCommand::Queues(command) => queues::run(&client, arguments, command),
        CtlCommand::JoinCluster { address } => {
            cluster::run(&client, arguments, &cluster::ClusterCommand::Join { address: address.clone() })
        }
        CtlCommand::ForgetClusterNode { node } => cluster::run(&client, arguments, &cluster::ClusterCommand::Forget { node: node.clone() }),
        CtlCommand::Ping => {
            client.get_json("/overview")?;
            match arguments.formatter {
                Formatter::Table => println!("Ping succeeded"),
                Formatter::Json => println!("{}", json!({"message": "Ping succeeded"})),
            }
            Ok(())
        }
        CtlCommand::AwaitStartup => await_startup(&client, arguments),
        CtlCommand::ClusterStatus => diagnostics::cluster_status(&client, arguments),
        CtlCommand::Environment => diagnostics::environment(&client, arguments),
        CtlCommand::Report => diagnostics::report(&client, arguments),
        CtlCommand::CheckAlarms => check_alarms(&client, arguments),
        CtlCommand::CheckPortConnectivity => check_port_connectivity(&client, arguments),
        CtlCommand::PurgeQueue { name } => {
            let vhost = arguments.vhost();
            arguments.inform(&format!("Purging queue '{name}' in vhost '{vhost}' ..."));
            client.request(
                "DELETE",
                &format!("/queues/{}/{}/contents", crate::url_path::encode_segment(vhost), crate::url_path::encode_segment(name)),
                None,
                &[],
            )?;
            arguments.report(&client.node()?, &format!("Purged queue '{name}'"));
            Ok(())
        }
        CtlCommand::DeleteQueue { name, if_unused, if_empty } => delete_queue(&client, arguments, name, *if_unused, *if_empty),
        CtlCommand::SetTopicPermissions { user, exchange, write, read } => {
            topic_permissions::set(&client, arguments, user, exchange, write, read)
        }
        CtlCommand::ClearTopicPermissions { user, exchange } => topic_permissions::clear(&client, arguments, user, exchange.as_deref()),
        CtlCommand::ListTopicPermissions => topic_permissions::list(&client, arguments),
        CtlCommand::ListUserTopicPermissions { user } => topic_permissions::list_of_user(&client, arguments, user),
        command => execute_definition_command(&client, arguments, command),
    }
}

/// The listing a `list ...` or `list_...` command asks for, with its columns.
fn listing_command(command: &CtlCommand) -> Option<(Listing, &[String])> {
    let (listing, columns) = match command {
        CtlCommand::List { what, columns } => (*what, columns),
        CtlCommand::ListQueues(columns) => (Listing::Queues, columns),
        CtlCommand::ListExchanges(columns) => (Listing::Exchanges, columns),
        CtlCommand::ListBindings(columns) => (Listing::Bindings, columns),
        CtlCommand::ListConnections(columns) => (Listing::Connections, columns),
        CtlCommand::ListChannels(columns) => (Listing::Channels, columns),
        CtlCommand::ListConsumers(columns) => (Listing::Consumers, columns),
        CtlCommand::ListUsers(columns) => (Listing::Users, columns),
        CtlCommand::ListVhosts(columns) => (Listing::Vhosts, columns),
        CtlCommand::ListPermissions(columns) => (Listing::Permissions, columns),
        CtlCommand::ListPolicies(columns) => (Listing::Policies, columns),
        _ => return None,
    };
    Some((listing, columns.columns.as_slice()))
}

fn delete_queue(client: &Client, arguments: &CtlArguments, name: &str, if_unused: bool, if_empty: bool) -> Result<(), CtlError> {
    let vhost = arguments.vhost();
    arguments.inform(&format!("Deleting queue '{name}' on vhost '{vhost}' ..."));
    let path = format!("/queues/{}/{}", crate::url_path::encode_segment(vhost), crate::url_path::encode_segment(name));
    let queue = match client.get_json(&path) {
        // rabbitmqctl answers a missing queue with EX_USAGE here (and EX_UNAVAILABLE in purge_queue).
        Err(CtlError::NotFound(_)) => return Err(CtlError::Usage(format!("queue '{name}' not found in vhost '{vhost}'"))),
        other => other?,
    };
    let mut query = Vec::new();
    if if_unused {
        query.push("if-unused=true");
    }
    if if_empty {
        query.push("if-empty=true");
    }
    let path = if query.is_empty() { path } else { format!("{path}?{}", query.join("&")) };
    client.request("DELETE", &path, None, &[])?;
    let messages = queue.get("messages").and_then(Value::as_u64).unwrap_or(0);
    arguments.report(&client.node()?, &format!("Queue was successfully deleted with {messages} messages"));
    Ok(())
}

fn await_startup(client: &Client, arguments: &CtlArguments) -> Result<(), CtlError> {
    let timeout = Duration::from_secs(arguments.timeout.unwrap_or(AWAIT_STARTUP_TIMEOUT_S));
    let deadline = Instant::now() + timeout;
    loop {
        match client.get_json("/overview") {
            Ok(_) => return Ok(()),
            // Only "nobody answers yet" is worth waiting for; a wrong password or port is not.
            Err(CtlError::Unavailable(_)) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(AWAIT_STARTUP_POLL_MS));
            }
            Err(CtlError::Unavailable(reason)) => {
                return Err(CtlError::Timeout(format!("the broker did not start within {} s: {reason}", timeout.as_secs())))
            }
            Err(other) => return Err(other),
        }
    }
}

fn check_alarms(client: &Client, arguments: &CtlArguments) -> Result<(), CtlError> {
    let node = client.node()?;
    let alarms = client.alarms()?;
    if alarms.is_empty() {
        match arguments.formatter {
            Formatter::Table => println!("Node {node} reported no alarms, local or clusterwide"),
            Formatter::Json => println!("{}", json!({"result": "ok"})),
        }
        return Ok(());
    }
    let resources: Vec<&str> = alarms.iter().filter_map(|alarm| alarm.get("resource").and_then(Value::as_str)).collect();
    if arguments.formatter == Formatter::Json {
        println!("{}", json!({"result": "error", "alarms": alarms}));
    }
    Err(CtlError::CheckFailed(format!("node {node} reported alarms: {} resource limit alarm in effect", resources.join(", "))))
}

/// Every listener the broker reports, with the management API the command reached, as
/// rabbitmq-diagnostics shows them.
fn listeners(client: &Client, overview: &Value) -> Vec<Value> {
    let node = overview.get("node").cloned().unwrap_or(Value::Null);
    let mut listeners: Vec<Value> = overview
        .get("listeners")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|listener| {
            let protocol = listener.get("protocol").cloned().unwrap_or(Value::Null);
            json!({"interface": listener.get("ip_address"), "node": node, "port": listener.get("port"),
                   "protocol": protocol, "purpose": listener_purpose(protocol.as_str().unwrap_or_default())})
        })
        .collect();
    // A broker that does not list the API the command reached (an older Lepus) still has it.
    let port = client.port();
    if !listeners.iter().any(|listener| listener.get("port").and_then(Value::as_u64) == Some(u64::from(port))) {
        listeners.push(json!({"interface": client.host(), "node": node, "port": port, "protocol": client.scheme(),
                              "purpose": listener_purpose(&client.scheme())}));
    }
    listeners
}

/// What a listener is for, in RabbitMQ's words (Lepus speaks no AMQP 1.0, which RabbitMQ adds).
fn listener_purpose(protocol: &str) -> &'static str {
    match protocol {
        "amqp/ssl" => "AMQP 0-9-1 over TLS",
        "http" => "HTTP API",
        "https" => "HTTP API over TLS (HTTPS)",
        "http/prometheus" => "Prometheus exporter API over HTTP",
        "stream" => "stream replication and client protocol",
        "clustering" => "inter-node and CLI tool communication",
        _ => "AMQP 0-9-1",
    }
}

fn check_port_connectivity(client: &Client, arguments: &CtlArguments) -> Result<(), CtlError> {
    let overview = client.get_json("/overview")?;
    let node = client::text(overview.get("node"));
    let listeners = listeners(client, &overview);
    let mut ports = Vec::new();
    for listener in &listeners {
        let port = listener.get("port").and_then(Value::as_u64).and_then(|port| u16::try_from(port).ok()).unwrap_or(0);
        // A listener on every interface is reached through the host the command reached.
        if let Err(error) = client::connect_tcp(&client.host(), port) {
            return Err(CtlError::CheckFailed(format!("port {port} on node {node} does not accept connections: {error}")));
        }
        ports.push(port.to_string());
    }
    match arguments.formatter {
        Formatter::Table => println!("Successfully connected to ports {} on node {node}.", ports.join(", ")),
        Formatter::Json => println!("{}", json!({"listeners": listeners, "node": node, "result": "ok"})),
    }
    Ok(())
}

fn status(client: &Client, arguments: &CtlArguments) -> Result<(), CtlError> {
    let (status, overview, node) = status_value(client)?;
    match arguments.formatter {
        Formatter::Json => println!("{status}"),
        Formatter::Table => print_status(&status, &overview, &node),
    }
    Ok(())
}

/// What `status --formatter json` prints, with the overview and node it was made of.
fn status_value(client: &Client) -> Result<(Value, Value, Value), CtlError> {
    let overview = client.get_json("/overview")?;
    let nodes = client.get_json("/nodes")?;
    let node = nodes.get(0).cloned().unwrap_or(Value::Null);
    let alarms = client.alarms()?;
    let totals = |key: &str| overview.get("object_totals").and_then(|totals| totals.get(key)).cloned().unwrap_or(Value::Null);
    let vhost_count = client.get_json("/vhosts")?.as_array().map(Vec::len).unwrap_or(0);
    // The keys of `rabbitmqctl status --formatter json` that Lepus can fill.
    let status = json!({
        "alarms": alarms,
        "disk_free": node.get("disk_free"),
        "disk_free_limit": node.get("disk_free_limit"),
        "file_descriptors": {"total_used": node.get("fd_used"), "total_limit": node.get("fd_total"),
                             "sockets_used": node.get("sockets_used"), "sockets_limit": node.get("sockets_total")},
        "listeners": listeners(client, &overview),
        "memory": {"strategy": "rss", "total": {"rss": node.get("mem_used")}},
        "pid": node.get("os_pid").and_then(Value::as_str).and_then(|pid| pid.parse::<u64>().ok()),
        "product_name": overview.get("product_name"),
        "product_version": overview.get("product_version"),
        "rabbitmq_version": overview.get("rabbitmq_version"),
        "totals": {"virtual_host_count": vhost_count, "connection_count": totals("connections"), "queue_count": totals("queues")},
        "uptime": node.get("uptime").and_then(Value::as_u64).map(|uptime_ms| uptime_ms / 1000),
        "vm_memory_high_watermark_limit": node.get("mem_limit"),
        "node": overview.get("node"),
    });
    Ok((status, overview, node))
}

fn print_status(status: &Value, overview: &Value, node: &Value) {
    let field = |value: &Value, path: &str| client::text(path.split('.').try_fold(value, |value, key| value.get(key)));
    println!("Status of node {}", field(status, "node"));
    println!("version: {} {}", field(status, "product_name"), field(status, "product_version"));
    println!("uptime_seconds: {}", field(status, "uptime"));
    for key in ["connections", "channels", "queues", "exchanges", "consumers"] {
        println!("{key}: {}", field(overview, &format!("object_totals.{key}")));
    }
    for key in ["messages", "messages_ready", "messages_unacknowledged"] {
        println!("{key}: {}", field(overview, &format!("queue_totals.{key}")));
    }
    println!("memory_rss_bytes: {}", field(node, "mem_used"));
    println!("memory_high_watermark_bytes: {}", field(node, "mem_limit"));
    println!("memory_alarm: {}", field(node, "mem_alarm"));
    println!("file_descriptors: {} / {}", field(node, "fd_used"), field(node, "fd_total"));
    println!("disk_free_bytes: {} (limit {})", field(node, "disk_free"), field(node, "disk_free_limit"));
    println!("disk_free_alarm: {}", field(node, "disk_free_alarm"));
    for listener in status.get("listeners").and_then(Value::as_array).into_iter().flatten() {
        println!(
            "listener: interface {}, port {}, protocol {}, purpose {}",
            field(listener, "interface"),
            field(listener, "port"),
            field(listener, "protocol"),
            field(listener, "purpose")
        );
    }
}

/// Users, vhosts, permissions, policies, connections and definitions.
fn execute_definition_command(client: &Client, arguments: &CtlArguments, command: &CtlCommand) -> Result<(), CtlError> {
    let vhost = arguments.vhost();
    match command {
        CtlCommand::AddUser { name, password, tags } => {
            let body = json!({"password": password, "tags": tags}).to_string();
            client.request("PUT", &format!("/users/{}", crate::url_path::encode_segment(name)), Some(&body), &[])?;
            println!("user '{name}' set");
        }
        CtlCommand::ChangePassword { name, password } => admin::change_password(client, name, password)?,
        CtlCommand::SetUserTags { name, tags } => admin::set_user_tags(client, name, tags)?,
        CtlCommand::ClearPermissions { user } => admin::clear_permissions(client, vhost, user)?,
        CtlCommand::SetVhostLimits { definition } => admin::set_vhost_limits(client, vhost, definition)?,
        CtlCommand::ClearVhostLimits => admin::clear_vhost_limits(client, vhost)?,
        CtlCommand::DeleteUser { name } => {
            client.request("DELETE", &format!("/users/{}", crate::url_path::encode_segment(name)), None, &[])?;
            println!("user '{name}' deleted");
        }
        CtlCommand::SetPermissions { user, configure, write, read } => {
            let body = json!({"configure": configure, "write": write, "read": read}).to_string();
            client.request(
                "PUT",
                &format!("/permissions/{}/{}", crate::url_path::encode_segment(vhost), crate::url_path::encode_segment(user)),
                Some(&body),
                &[],
            )?;
            println!("permissions of '{user}' in '{vhost}' set");
        }
        CtlCommand::AddVhost { name, description } => {
            let body = json!({"description": description}).to_string();
            client.request("PUT", &format!("/vhosts/{}", crate::url_path::encode_segment(name)), Some(&body), &[])?;
            println!("vhost '{name}' set");
        }
        CtlCommand::DeleteVhost { name } => {
            client.request("DELETE", &format!("/vhosts/{}", crate::url_path::encode_segment(name)), None, &[])?;
            println!("vhost '{name}' deleted");
        }
        CtlCommand::SetPolicy { name, pattern, definition, priority, apply_to } => {
            let definition: Value =
                serde_json::from_str(definition).map_err(|error| CtlError::Usage(format!("the definition is not JSON: {error}")))?;
            let body = json!({"pattern": pattern, "definition": definition, "priority": priority, "apply-to": apply_to});
            client.request(
                "PUT",
                &format!("/policies/{}/{}", crate::url_path::encode_segment(vhost), crate::url_path::encode_segment(name)),
                Some(&body.to_string()),
                &[],
            )?;
            println!("policy '{name}' in '{vhost}' set");
        }
        CtlCommand::ClearPolicy { name } => {
            client.request(
                "DELETE",
                &format!("/policies/{}/{}", crate::url_path::encode_segment(vhost), crate::url_path::encode_segment(name)),
                None,
                &[],
            )?;
            println!("policy '{name}' in '{vhost}' cleared");
        }
        CtlCommand::CloseConnection { name, reason } => {
            client.request("DELETE", &format!("/connections/{}", crate::url_path::encode_segment(name)), None, &[("X-Reason", reason)])?;
            println!("closed {name}");
        }
        CtlCommand::ExportDefinitions { file } => export_definitions(client, file)?,
        CtlCommand::ImportDefinitions { file } => import_definitions(client, file)?,
        other => return Err(CtlError::Usage(format!("{other:?} is not a definitions command"))),
    }
    Ok(())
}

fn export_definitions(client: &Client, file: &str) -> Result<(), CtlError> {
    let definitions = client.get_json("/definitions")?;
    let text = serde_json::to_string_pretty(&definitions).map_err(|error| CtlError::Software(error.to_string()))?;
    if file == "-" {
        println!("{text}");
    } else {
        std::fs::write(file, format!("{text}\n")).map_err(|error| CtlError::CannotCreate(format!("{file}: {error}")))?;
        eprintln!("exported definitions to {file}");
    }
    Ok(())
}

fn import_definitions(client: &Client, file: &str) -> Result<(), CtlError> {
    let text = if file == "-" {
        std::io::read_to_string(std::io::stdin()).map_err(|error| CtlError::NoInput(format!("stdin: {error}")))?
    } else {
        std::fs::read_to_string(file).map_err(|error| CtlError::NoInput(format!("{file}: {error}")))?
    };
    serde_json::from_str::<Value>(&text).map_err(|error| CtlError::DataError(format!("{file} is not JSON: {error}")))?;
    client.request("POST", "/definitions", Some(&text), &[])?;
    eprintln!("imported definitions from {file}");
    Ok(())
}
