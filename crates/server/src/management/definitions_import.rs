//! POST /api/definitions: a definitions file is checked whole, then applied whole. Every entry is
//! parsed, and the exchanges, queues and bindings are tried on a copy of each vhost's topology
//! (`Vhost::shape`) with the same rules a declaration meets; when anything is wrong the answer is
//! 400 listing every problem, and nothing has been applied. RabbitMQ 3.10 applies a file entry by
//! entry and stops at the first error, leaving what came before it in place.

use super::json::{self, text};
use super::routes::{exchange_declaration, password_hash_of, queue_definition, tags_of};
use super::{vhosts, ApiError};
use crate::auth::{Permission, User};
use crate::broker::Broker;
use crate::policy::Policy;
use crate::topic_permissions::{TopicPermission, TOPIC_PERMISSIONS_MAX};
use crate::vhost_limits::{VhostLimit, VhostLimits};
use amqp_codec::ShortStr;
use broker_core::exchange::{Binding, Destination};
use broker_core::vhost::{ExchangeDeclaration, QueueDefinition, QueueType, Vhost, QUEUE_TYPE_ARGUMENT};
use broker_core::AmqpError;
use serde_json::Value;
use std::collections::{HashMap, HashSet};

/// The most problems an answer lists one by one; the rest are counted, so a file of a million bad
/// entries gets a bounded answer.
pub const PROBLEMS_LISTED_MAX: usize = 200;

/// The runtime parameter component that holds a vhost's limits.
pub const VHOST_LIMITS_COMPONENT: &str = "vhost-limits";

/// Global parameters that describe the exporting cluster rather than its topology: skipped.
const DESCRIPTIVE_GLOBAL_PARAMETERS: &[&str] = &["internal_cluster_id", "cluster_name"];

/// What is wrong with a file, in the order found.
#[derive(Default)]
struct Problems {
    listed: Vec<String>,
    unlisted: usize,
}

impl Problems {
    fn add(&mut self, problem: String) {
        if self.listed.len() < PROBLEMS_LISTED_MAX {
            // One line each: RabbitMQ's policy validation texts span lines.
            self.listed.push(problem.lines().map(str::trim).filter(|line| !line.is_empty()).collect::<Vec<_>>().join(" "));
        } else {
            self.unlisted += 1;
        }
    }

    /// The value, or None with the problem noted, prefixed by what the entry is.
    fn check<T>(&mut self, what: &dyn Fn() -> String, result: Result<T, ApiError>) -> Option<T> {
        result.map_err(|error| self.add(format!("{}: {}", what(), error.reason))).ok()
    }

    fn is_empty(&self) -> bool {
        self.listed.is_empty()
    }

    fn into_error(mut self) -> ApiError {
        let total = self.listed.len() + self.unlisted;
        if self.unlisted > 0 {
            self.listed.push(format!("and {} more problems", self.unlisted));
        }
        let reason = format!(
            "the definitions were not imported, nothing was applied: {total} problem{}\n{}",
            if total == 1 { "" } else { "s" },
            self.listed.join("\n")
        );
        ApiError::bad_request(reason).with_problems(self.listed)
    }
}

fn amqp_reason(error: AmqpError) -> ApiError {
    ApiError::bad_request(format!("{} {}", error.code, error.text))
}

/// A vhost the file creates or updates.
struct NewVhost {
    name: String,
    description: String,
    tags: Vec<String>,
    default_queue_type: Option<QueueType>,
}

/// Everything a file asks for, parsed and checked, in the order it is applied.
#[derive(Default)]
struct Plan {
    vhosts: Vec<NewVhost>,
    users: Vec<User>,
    permissions: Vec<Permission>,
    topic_permissions: Vec<TopicPermission>,
    limits: Vec<(String, VhostLimits)>,
    policies: Vec<Policy>,
    exchanges: Vec<(String, ExchangeDeclaration)>,
    queues: Vec<(String, QueueDefinition)>,
    bindings: Vec<(String, ShortStr, Binding)>,
}

/// Reads the parts of a file, noting every problem.
struct Reader<'a> {
    broker: &'a Broker,
    body: &'a Value,
    into_vhost: Option<&'a str>,
    problems: Problems,
    plan: Plan,
    /// Vhosts the objects name that neither exist nor are in the file, with how many name each.
    missing_vhosts: Vec<(String, usize)>,
}

/// Checks the whole file and applies it only when nothing is wrong with it. `into_vhost` is the
/// vhost of POST /api/definitions/{vhost}: the objects' own `vhost` fields are then ignored.
pub fn import(broker: &Broker, body: &Value, into_vhost: Option<&str>) -> Result<(), ApiError> {
    let mut reader = Reader { broker, body, into_vhost, problems: Problems::default(), plan: Plan::default(), missing_vhosts: Vec::new() };
    if !body.is_object() {
        return Err(ApiError::bad_request("a definitions file is a JSON object"));
    }
    reader.read_control_plane();
    reader.read_topology();
    for (vhost, count) in &reader.missing_vhosts {
        reader.problems.add(format!("vhost '{vhost}' (named by {count} entries) neither exists nor is defined in the file"));
    }
    if !reader.problems.is_empty() {
        return Err(reader.problems.into_error());
    }
    apply(broker, reader.plan)
}

impl<'a> Reader<'a> {
    fn section(&mut self, key: &str) -> &'a [Value] {
        let body: &'a Value = self.body;
        match body.get(key) {
            None | Some(Value::Null) => &[],
            Some(Value::Array(items)) => items,
            Some(_) => {
                self.problems.add(format!("{key} must be a list"));
                &[]
            }
        }
    }

    /// The vhost an entry belongs to, noted as missing when it does not exist and the file does
    /// not create it.
    fn vhost_of(&mut self, item: &Value, what: &dyn Fn() -> String) -> Option<String> {
        let vhost = match self.into_vhost {
            Some(vhost) => vhost.to_string(),
            None => self.problems.check(what, text(item, "vhost"))?.unwrap_or_else(|| "/".to_string()),
        };
        let known = self.broker.has_vhost(&vhost) || self.plan.vhosts.iter().any(|created| created.name == vhost);
        if known {
            return Some(vhost);
        }
        match self.missing_vhosts.iter_mut().find(|(name, _)| *name == vhost) {
            Some((_, count)) => *count += 1,
            None => self.missing_vhosts.push((vhost, 1)),
        }
        None
    }

    fn read_control_plane(&mut self) {
        if self.into_vhost.is_none() {
            for item in self.section("vhosts") {
                self.read_vhost(item);
            }
        }
        for item in self.section("users") {
            self.read_user(item);
        }
        for item in self.section("permissions") {
            self.read_permission(item);
        }
        for item in self.section("topic_permissions") {
            self.read_topic_permission(item);
        }
        for item in self.section("parameters") {
            self.read_parameter(item);
        }
        for item in self.section("global_parameters") {
            let name = text(item, "name").ok().flatten().unwrap_or_default();
            if DESCRIPTIVE_GLOBAL_PARAMETERS.contains(&name.as_str()) {
                tracing::info!(parameter = name, "definitions import: a global parameter of the exporting cluster, skipped");
            } else {
                self.problems.add(format!("global parameter '{name}': not supported by Lepus yet"));
            }
        }
        for item in self.section("policies") {
            let name = text(item, "name").ok().flatten().unwrap_or_default();
            let what = || format!("policy '{name}'");
            let Some(vhost) = self.vhost_of(item, &what) else { continue };
            let what = || format!("policy '{name}' in vhost '{vhost}'");
            if let Some(policy) = self.problems.check(&what, vhosts::policy_from_body(&vhost, &name, item)) {
                self.plan.policies.push(policy);
            }
        }
    }

    fn read_vhost(&mut self, item: &Value) {
        let name = text(item, "name").ok().flatten().unwrap_or_default();
        let what = || format!("vhost '{name}'");
        if name.is_empty() || name.len() > 255 {
            self.problems.add(format!("{}: a vhost name must have 1 to 255 bytes", what()));
            return;
        }
        let metadata = item.get("metadata").unwrap_or(&Value::Null);
        // RabbitMQ 3.10.8 reads it from the metadata (rabbit_definitions:add_vhost); later
        // versions' files may carry it beside the name too.
        let mut default_queue_type = None;
        for default_type in [text(item, "default_queue_type"), text(metadata, "default_queue_type")] {
            match self.problems.check(&what, default_type).flatten().as_deref() {
                None | Some("undefined") => {}
                Some(name) => match QueueType::from_name(name) {
                    Some(queue_type) => default_queue_type = Some(queue_type),
                    None => {
                        self.problems.add(format!("{}: '{name}' is not a queue type (classic, quorum, stream)", what()));
                        return;
                    }
                },
            }
        }
        let description = text(item, "description").ok().flatten().or(text(metadata, "description").ok().flatten()).unwrap_or_default();
        let tags = if item.get("tags").is_some() { tags_of(item) } else { tags_of(metadata) };
        self.plan.vhosts.push(NewVhost { name, description, tags, default_queue_type });
    }

    fn read_user(&mut self, item: &Value) {
        let name = text(item, "name").ok().flatten().unwrap_or_default();
        let what = || format!("user '{name}'");
        if name.is_empty() {
            self.problems.add("an entry of users lacks name".to_string());
            return;
        }
        if item.get("limits").is_some_and(|limits| limits.as_object().is_some_and(|limits| !limits.is_empty())) {
            self.problems.add(format!("{}: user limits are not supported by Lepus yet", what()));
        }
        let Some(hash) = self.problems.check(&what, password_hash_of(item)) else { return };
        use base64::Engine;
        if item.get("password").is_none() && base64::engine::general_purpose::STANDARD.decode(&hash).is_err() {
            self.problems.add(format!("{}: password_hash is not base64", what()));
            return;
        }
        self.plan.users.push(User::new(&name, hash, tags_of(item)));
    }

    fn read_permission(&mut self, item: &Value) {
        let user = text(item, "user").ok().flatten().unwrap_or_default();
        let what = || format!("permission of user '{user}'");
        let Some(vhost) = self.vhost_of(item, &what) else { return };
        let what = || format!("permission of user '{user}' in vhost '{vhost}'");
        if !self.knows_user(&user) {
            self.problems.add(format!("{}: no such user", what()));
            return;
        }
        let expression = |key: &str| text(item, key).map(|value| value.unwrap_or_default());
        let expressions = (|| Ok::<_, ApiError>((expression("configure")?, expression("write")?, expression("read")?)))();
        let Some((configure, write, read)) = self.problems.check(&what, expressions) else { return };
        let permission =
            Permission::new(&user, &vhost, &configure, &write, &read).map_err(|error| ApiError::bad_request(error.to_string()));
        if let Some(permission) = self.problems.check(&what, permission) {
            self.plan.permissions.push(permission);
        }
    }

    fn knows_user(&self, user: &str) -> bool {
        self.broker.users.get(user).is_some() || self.plan.users.iter().any(|planned| planned.name == user)
    }

    fn read_topic_permission(&mut self, item: &Value) {
        let user = text(item, "user").ok().flatten().unwrap_or_default();
        let exchange = text(item, "exchange").ok().flatten().unwrap_or_default();
        let what = || format!("topic permission of user '{user}' on exchange '{exchange}'");
        let Some(vhost) = self.vhost_of(item, &what) else { return };
        let what = || format!("topic permission of user '{user}' on exchange '{exchange}' in vhost '{vhost}'");
        if !self.knows_user(&user) {
            self.problems.add(format!("{}: no such user", what()));
            return;
        }
        let expression = |key: &str| text(item, key)?.ok_or_else(|| ApiError::bad_request(format!("lacks {key}")));
        let expressions = (|| Ok::<_, ApiError>((expression("exchange")?, expression("write")?, expression("read")?)))();
        let Some((exchange, write, read)) = self.problems.check(&what, expressions) else { return };
        let permission =
            TopicPermission::new(&user, &vhost, &exchange, &write, &read).map_err(|error| ApiError::bad_request(error.to_string()));
        if self.broker.topic_permissions.len() + self.plan.topic_permissions.len() >= TOPIC_PERMISSIONS_MAX {
            self.problems.add(format!("{}: more than {TOPIC_PERMISSIONS_MAX} topic permissions", what()));
            return;
        }
        if let Some(permission) = self.problems.check(&what, permission) {
            self.plan.topic_permissions.push(permission);
        }
    }

    fn read_parameter(&mut self, item: &Value) {
        let component = text(item, "component").ok().flatten().unwrap_or_default();
        let name = text(item, "name").ok().flatten().unwrap_or_default();
        let what = || format!("parameter '{name}' of component '{component}'");
        let Some(vhost) = self.vhost_of(item, &what) else { return };
        let what = || format!("parameter '{name}' of component '{component}' in vhost '{vhost}'");
        if component != VHOST_LIMITS_COMPONENT {
            self.problems.add(format!("{}: not supported by Lepus yet", what()));
            return;
        }
        let limits = VhostLimits::from_json(item.get("value").unwrap_or(&Value::Null)).map_err(ApiError::bad_request);
        if let Some(limits) = self.problems.check(&what, limits) {
            self.plan.limits.push((vhost, limits));
        }
    }
}

/// Exported exchanges: the default and `amq.*` exchanges are every vhost's own, and skipped.
pub fn is_exported_exchange(name: &str) -> bool {
    !name.is_empty() && !name.starts_with("amq.")
}

impl Reader<'_> {
    /// Tries the exchanges, queues and bindings on copies of their vhosts' topologies.
    fn read_topology(&mut self) {
        let mut shapes: HashMap<String, Vhost<()>> = HashMap::new();
        let broker = self.broker;
        // Exchanges and queues refused, by vhost and name.
        let mut refused: HashSet<(String, bool, ShortStr)> = HashSet::new();
        for item in self.section("exchanges") {
            let name = text(item, "name").ok().flatten().unwrap_or_default();
            if !is_exported_exchange(&name) {
                continue;
            }
            let what = || format!("exchange '{name}'");
            let Some(vhost) = self.vhost_of(item, &what) else { continue };
            let what = || format!("exchange '{name}' in vhost '{vhost}'");
            let Some(declaration) = self.problems.check(&what, exchange_declaration(&name, item)) else { continue };
            let tried = shape_of(&mut shapes, broker, &vhost).declare_exchange(&declaration).map_err(amqp_reason);
            match self.problems.check(&what, tried) {
                Some(_) => self.plan.exchanges.push((vhost, declaration)),
                None => {
                    refused.insert((vhost, false, declaration.name));
                }
            }
        }
        for item in self.section("queues") {
            let name = text(item, "name").ok().flatten().unwrap_or_default();
            let what = || format!("queue '{name}'");
            let Some(vhost) = self.vhost_of(item, &what) else { continue };
            let what = || format!("queue '{name}' in vhost '{vhost}'");
            let Some(mut definition) = self.problems.check(&what, queue_definition(&name, item)) else { continue };
            let queue_bound = self.queue_bound(&vhost);
            let tried = check_queue_type(item, &mut definition, &vhost).and_then(|()| {
                declare_queue_on(shape_of(&mut shapes, broker, &vhost), definition.clone(), &vhost, queue_bound).map_err(amqp_reason)
            });
            match self.problems.check(&what, tried) {
                Some(()) => self.plan.queues.push((vhost, definition)),
                None => {
                    refused.insert((vhost, true, definition.name));
                }
            }
        }
        for item in self.section("bindings") {
            let source = text(item, "source").ok().flatten().unwrap_or_default();
            let destination = text(item, "destination").ok().flatten().unwrap_or_default();
            let what = || format!("binding from '{source}' to '{destination}'");
            let Some(vhost) = self.vhost_of(item, &what) else { continue };
            let what = || format!("binding from '{source}' to '{destination}' in vhost '{vhost}'");
            let Some((source, binding)) = self.problems.check(&what, binding_of(item)) else { continue };
            // The default exchange's bindings are implicit. A binding whose end was refused is
            // not listed again: the end's own problem says why.
            let destination = match &binding.destination {
                Destination::Queue(name) => (vhost.clone(), true, name.clone()),
                Destination::Exchange(name) => (vhost.clone(), false, name.clone()),
            };
            let end_refused = refused.contains(&(vhost.clone(), false, source.clone())) || refused.contains(&destination);
            if source.is_empty() || end_refused {
                continue;
            }
            let tried = bind_on(shape_of(&mut shapes, broker, &vhost), &source, binding.clone()).map_err(amqp_reason);
            if self.problems.check(&what, tried).is_some() {
                self.plan.bindings.push((vhost, source, binding));
            }
        }
    }

    /// The `max-queues` a vhost will have when the file's limits are applied.
    fn queue_bound(&self, vhost: &str) -> Option<u64> {
        match self.plan.limits.iter().rev().find(|(name, _)| name == vhost) {
            Some((_, limits)) => limits.bound(VhostLimit::MaxQueues),
            None => self.broker.vhost_limits(vhost).flatten()?.bound(VhostLimit::MaxQueues),
        }
    }
}

/// The copy of a vhost's topology the file's changes are tried on: the vhost's as it is, or an
/// empty one for a vhost the file creates.
fn shape_of<'a>(shapes: &'a mut HashMap<String, Vhost<()>>, broker: &Broker, vhost: &str) -> &'a mut Vhost<()> {
    shapes.entry(vhost.to_string()).or_insert_with(|| match broker.vhost(vhost) {
        Some(topology) => topology.read().shape(),
        None => Vhost::new(vhost),
    })
}

/// Refuses a queue of a type Lepus does not run. The type is the queue's `x-queue-type` argument,
/// as RabbitMQ 3.10 reads it; without one, the `type` field RabbitMQ 3.13 and 4.x export. RabbitMQ
/// 3.10 ignores that field, but a file that says `quorum` there asks for a quorum queue, and Lepus
/// refuses it rather than make it classic.
///
/// A type named only in that field is written into the arguments as `x-queue-type`, so the queue
/// is made of that type (a file exported by RabbitMQ 3.13 or 4.x imports as it was).
fn check_queue_type(item: &Value, definition: &mut QueueDefinition, vhost: &str) -> Result<(), ApiError> {
    let queue_type = if definition.arguments.get(QUEUE_TYPE_ARGUMENT).is_some() {
        QueueType::from_arguments(&definition.name, vhost, &definition.arguments).map_err(amqp_reason)?
    } else {
        match text(item, "type")? {
            None => QueueType::Classic,
            Some(type_name) => {
                let queue_type = QueueType::from_name(&type_name)
                    .ok_or_else(|| ApiError::bad_request(format!("unsupported queue type '{type_name}'")))?;
                if queue_type != QueueType::Classic {
                    let name = bytes::Bytes::copy_from_slice(queue_type.name().as_bytes());
                    definition.arguments.insert(QUEUE_TYPE_ARGUMENT, amqp_codec::FieldValue::LongStr(name));
                }
                queue_type
            }
        }
    };
    if !crate::queue_type::capabilities(queue_type).implemented {
        return Err(ApiError::bad_request(format!(
            "540 NOT_IMPLEMENTED - queue type '{}' is not supported by Lepus yet",
            queue_type.name()
        )));
    }
    Ok(())
}

/// queue.declare on a copy of the topology, with the checks the broker makes.
fn declare_queue_on(shape: &mut Vhost<()>, definition: QueueDefinition, vhost: &str, queue_bound: Option<u64>) -> Result<(), AmqpError> {
    if let Some(bound) = queue_bound {
        crate::broker::check_queue_limit(shape, &definition, false, false, bound)?;
    }
    shape.declare_queue(definition, false, false, 0, |definition| {
        crate::queue_type::capabilities(definition.queue_type).check_declare(definition, vhost)
    })?;
    Ok(())
}

/// queue.bind or exchange.bind on a copy of the topology: the destination must exist too.
fn bind_on(shape: &mut Vhost<()>, source: &ShortStr, binding: Binding) -> Result<(), AmqpError> {
    if let Destination::Queue(queue) = &binding.destination {
        shape.require_queue(queue, 0)?;
    }
    shape.bind(source, binding)?;
    Ok(())
}

fn binding_of(item: &Value) -> Result<(ShortStr, Binding), ApiError> {
    let required = |key: &str| text(item, key)?.ok_or_else(|| ApiError::bad_request(format!("lacks {key}")));
    let source = json::short(&required("source")?, "source")?;
    let destination_name = json::short(&required("destination")?, "destination")?;
    let destination = match required("destination_type")?.as_str() {
        "queue" => Destination::Queue(destination_name),
        "exchange" => Destination::Exchange(destination_name),
        other => return Err(ApiError::bad_request(format!("unknown destination_type {other}"))),
    };
    let binding = Binding {
        destination,
        routing_key: json::short(&text(item, "routing_key")?.unwrap_or_default(), "routing key")?,
        arguments: json::json_to_table(item.get("arguments"))?,
    };
    Ok((source, binding))
}

/// Applies a checked file: vhosts, users, permissions and topic permissions, then limits and policies, exchanges,
/// queues and bindings, as RabbitMQ orders them. Only a failure to store (disk) can stop it now.
fn apply(broker: &Broker, plan: Plan) -> Result<(), ApiError> {
    for vhost in plan.vhosts {
        broker.put_vhost(&vhost.name, vhost.description, vhost.tags, vhost.default_queue_type)?;
    }
    for user in plan.users {
        broker.put_user(user)?;
    }
    for permission in plan.permissions {
        broker.put_permission(permission)?;
    }
    for permission in plan.topic_permissions {
        broker.put_topic_permission(permission)?;
    }
    broker.persist()?;
    for (vhost, limits) in plan.limits {
        broker.set_vhost_limits(&vhost, limits)?;
    }
    for policy in plan.policies {
        broker.put_policy(policy)?;
    }
    for (vhost, declaration) in plan.exchanges {
        broker.declare_exchange(&vhost, &declaration)?;
    }
    for (vhost, definition) in plan.queues {
        broker.declare_queue(&vhost, definition, false, false, 0)?;
    }
    for (vhost, source, binding) in plan.bindings {
        broker.bind(&vhost, &source, binding)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn broker(name: &str) -> std::sync::Arc<Broker> {
        let data_dir = std::env::temp_dir().join(format!("lepus-import-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&data_dir);
        let config = crate::config::ServerConfig { data_dir, ..crate::config::ServerConfig::default() };
        Broker::open(config).expect("the broker opens")
    }

    fn entry(user: &str, vhost: &str, write: &str) -> Value {
        json!({"user": user, "vhost": vhost, "exchange": "events", "write": write, "read": ".*"})
    }

    #[test]
    fn topic_permissions_need_their_user_and_vhost_and_valid_expressions_before_anything_applies() {
        let broker = broker("topic-refused");
        let file = json!({
            "users": [{"name": "ann", "password": "secret", "tags": ""}],
            "topic_permissions": [entry("nobody", "/", ".*"), entry("ann", "nowhere", ".*"), entry("ann", "/", "(")],
        });
        let error = import(&broker, &file, None).expect_err("refused");
        assert!(
            error.problems.iter().any(|problem| problem.contains("user 'nobody'") && problem.contains("no such user")),
            "{:?}",
            error.problems
        );
        assert!(error.problems.iter().any(|problem| problem.contains("vhost 'nowhere'")), "{:?}", error.problems);
        assert!(error.problems.iter().any(|problem| problem.contains("invalid regular expression '('")), "{:?}", error.problems);
        assert!(broker.users.get("ann").is_none(), "nothing was applied");
        assert!(broker.topic_permissions.list().is_empty());
    }

    #[test]
    fn topic_permissions_import_when_the_file_creates_their_user_and_vhost() {
        let broker = broker("topic-applied");
        let file = json!({
            "users": [{"name": "ann", "password": "secret", "tags": ""}],
            "vhosts": [{"name": "prod"}],
            "topic_permissions": [entry("ann", "prod", "^{username}\\."), entry("guest", "/", "")],
        });
        import(&broker, &file, None).expect("imported");
        let entries = broker.topic_permissions.list();
        let imported: Vec<(&str, &str, &str)> =
            entries.iter().map(|entry| (entry.user.as_str(), entry.vhost.as_str(), entry.write.as_str())).collect();
        assert_eq!(imported, [("guest", "/", ""), ("ann", "prod", "^{username}\\.")]);
    }
}
