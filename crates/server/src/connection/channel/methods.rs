//! The methods a client sends on a channel: one dispatch function per method class, each
//! handing a method to what it does.

use super::{random_name, After, Channel, Content, Context, Transaction};
use crate::auth::Access;
use crate::queue_type::ConsumerRemoval;
use amqp_codec::{
    class_id, BasicCancelOk, BasicQosOk, BasicRecoverOk, ChannelCloseOk, ChannelFlowOk, ConfirmSelectOk, ExchangeBindOk, ExchangeDeclareOk,
    ExchangeDeleteOk, ExchangeUnbindOk, FieldTable, FieldValue, Method, QueueBindOk, QueueDeclare, QueueDeclareOk, QueueDelete,
    QueueDeleteOk, QueuePurgeOk, QueueUnbindOk, ShortStr, TxRollbackOk, TxSelectOk,
};
use broker_core::exchange::{Binding, Destination};
use broker_core::vhost::{ExchangeDeclaration, QueueDefinition, QueueType};
use broker_core::AmqpError;
use bytes::BytesMut;
use std::sync::atomic::Ordering;

/// A method a client may not send on a channel (a server's method, or a connection method).
fn refuse(method: &Method) -> AmqpError {
    AmqpError::command_invalid(format!("a client may not send {} on a channel", method.name()))
}

impl Channel {
    /// Dispatches a method to its class.
    pub(super) fn handle_method(&mut self, context: &mut Context, method: Method) -> Result<After, AmqpError> {
        match method.class_id() {
            class_id::BASIC => self.basic_method(context, method),
            class_id::CHANNEL => self.channel_method(context, method),
            class_id::EXCHANGE => self.exchange_method(context, method),
            class_id::QUEUE => self.queue_method(context, method),
            class_id::TX => self.tx_method(context, method),
            class_id::CONFIRM => self.confirm_method(context, method),
            class_id::ACCESS => match method {
                Method::AccessRequest(_) => {
                    context.reply(self.id(), amqp_codec::AccessRequestOk { ticket: 1 }.into());
                    Ok(After::KeepOpen)
                }
                other => Err(refuse(&other)),
            },
            _ => Err(refuse(&method)),
        }
    }

    /// basic.*: publish, settle, QoS, consume, cancel, get and recover.
    fn basic_method(&mut self, context: &mut Context, method: Method) -> Result<After, AmqpError> {
        let id = self.id();
        match method {
            Method::BasicPublish(publish) => {
                context.connection.has_published.store(true, Ordering::Release);
                if publish.immediate {
                    return Err(AmqpError::not_implemented("immediate=true"));
                }
                self.content = Some(Content {
                    exchange: publish.exchange,
                    routing_key: publish.routing_key,
                    mandatory: publish.mandatory,
                    header: None,
                    body: BytesMut::new(),
                    first_body_frame: None,
                    body_received: 0,
                });
            }
            Method::BasicAck(ack) => self.settle(context, ack.delivery_tag, ack.multiple, None)?,
            Method::BasicNack(nack) => self.settle(context, nack.delivery_tag, nack.multiple, Some(nack.requeue))?,
            Method::BasicReject(reject) => self.settle(context, reject.delivery_tag, false, Some(reject.requeue))?,
            Method::BasicQos(qos) => {
                if qos.prefetch_size != 0 {
                    return Err(AmqpError::not_implemented(format!("prefetch_size!=0 ({})", qos.prefetch_size)));
                }
                if qos.global {
                    self.shared.prefetch_global.store(u32::from(qos.prefetch_count), Ordering::Release);
                } else {
                    self.consumer_prefetch = u32::from(qos.prefetch_count);
                    self.shared.prefetch_count.store(self.consumer_prefetch, Ordering::Relaxed);
                }
                context.reply(id, BasicQosOk {}.into());
                self.dispatch_consumed_queues();
            }
            Method::BasicConsume(consume) => self.consume(context, consume)?,
            Method::BasicCancel(cancel) => {
                if self.reply_consumer.as_ref().is_some_and(|(_, tag)| *tag == cancel.consumer_tag) {
                    if let Some((token, _)) = self.reply_consumer.take() {
                        context.broker.reply_consumers.unregister(&token);
                    }
                }
                let removed = self.consumers.remove(&cancel.consumer_tag);
                self.shared.consumer_count.store(self.consumers.len() as u32, Ordering::Relaxed);
                if let Some((consumer, queue)) = removed {
                    consumer.cancelled.store(true, Ordering::Release);
                    if queue.cancel(&consumer) == ConsumerRemoval::DeleteQueue {
                        context.broker.remove_queue(&context.vhost, queue.name());
                    }
                }
                if !cancel.nowait {
                    context.reply(id, BasicCancelOk { consumer_tag: cancel.consumer_tag }.into());
                }
            }
            Method::BasicGet(get) => {
                let name = self.queue_name(&get.queue)?;
                context.check(Access::Read, "queue", name.as_bytes())?;
                let queue = self.require_queue(context, &name)?;
                queue.capabilities().check_get(queue.name(), &context.vhost)?;
                queue.check_local()?;
                self.answer_get(context, queue, get.no_ack, 0);
            }
            Method::BasicRecover(recover) => {
                self.recover(recover.requeue)?;
                context.reply(id, BasicRecoverOk {}.into());
            }
            Method::BasicRecoverAsync(recover) => self.recover(recover.requeue)?,
            other => return Err(refuse(&other)),
        }
        Ok(After::KeepOpen)
    }

    /// channel.*: close and flow (open is the connection's).
    fn channel_method(&mut self, context: &mut Context, method: Method) -> Result<After, AmqpError> {
        let id = self.id();
        match method {
            Method::ChannelClose(_) => {
                self.release(context);
                context.reply(id, ChannelCloseOk {}.into());
                return Ok(After::Forget);
            }
            Method::ChannelCloseOk(_) => return Ok(After::Forget),
            Method::ChannelOpen(_) => return Err(AmqpError::channel_error("second 'channel.open' seen")),
            Method::ChannelFlow(flow) => {
                if !flow.active {
                    // RabbitMQ 3.x refuses client-side flow control the same way.
                    return Err(AmqpError::not_implemented("active=false"));
                }
                self.shared.flow_active.store(true, Ordering::Release);
                context.reply(id, ChannelFlowOk { active: true }.into());
            }
            Method::ChannelFlowOk(_) => {}
            other => return Err(refuse(&other)),
        }
        Ok(After::KeepOpen)
    }

    /// exchange.*: declare, delete, bind, unbind.
    fn exchange_method(&mut self, context: &mut Context, method: Method) -> Result<After, AmqpError> {
        let id = self.id();
        match method {
            Method::ExchangeDeclare(declare) => {
                let declaration = ExchangeDeclaration {
                    name: declare.exchange,
                    kind: declare.exchange_type,
                    passive: declare.passive,
                    durable: declare.durable,
                    auto_delete: declare.auto_delete,
                    internal: declare.internal,
                    arguments: declare.arguments,
                };
                if !declaration.passive {
                    context.check(Access::Configure, "exchange", declaration.name.as_bytes())?;
                }
                let ticket = context.broker.declare_exchange_unwaited(&context.vhost, &declaration)?;
                context.hold_until_durable(ticket);
                if !declare.nowait {
                    context.reply(id, ExchangeDeclareOk {}.into());
                }
            }
            Method::ExchangeDelete(delete) => {
                context.check(Access::Configure, "exchange", delete.exchange.as_bytes())?;
                context.broker.delete_exchange(&context.vhost, &delete.exchange, delete.if_unused)?;
                if !delete.nowait {
                    context.reply(id, ExchangeDeleteOk {}.into());
                }
            }
            Method::ExchangeBind(bind) => {
                context.check(Access::Write, "exchange", bind.destination.as_bytes())?;
                context.check(Access::Read, "exchange", bind.source.as_bytes())?;
                check_binding_topic(context, &bind.source, &bind.routing_key)?;
                let binding = Binding {
                    destination: Destination::Exchange(bind.destination),
                    routing_key: bind.routing_key,
                    arguments: bind.arguments,
                };
                let ticket = context.broker.bind_unwaited(&context.vhost, &bind.source, binding)?;
                context.hold_until_durable(ticket);
                if !bind.nowait {
                    context.reply(id, ExchangeBindOk {}.into());
                }
            }
            Method::ExchangeUnbind(unbind) => {
                context.check(Access::Write, "exchange", unbind.destination.as_bytes())?;
                context.check(Access::Read, "exchange", unbind.source.as_bytes())?;
                check_binding_topic(context, &unbind.source, &unbind.routing_key)?;
                let binding = Binding {
                    destination: Destination::Exchange(unbind.destination),
                    routing_key: unbind.routing_key,
                    arguments: unbind.arguments,
                };
                let ticket = context.broker.unbind_unwaited(&context.vhost, &unbind.source, &binding)?;
                context.hold_until_durable(ticket);
                if !unbind.nowait {
                    context.reply(id, ExchangeUnbindOk {}.into());
                }
            }
            other => return Err(refuse(&other)),
        }
        Ok(After::KeepOpen)
    }

    /// queue.*: declare, bind, unbind, purge, delete.
    fn queue_method(&mut self, context: &mut Context, method: Method) -> Result<After, AmqpError> {
        let id = self.id();
        match method {
            Method::QueueDeclare(declare) => self.queue_declare(context, declare)?,
            Method::QueueBind(bind) => {
                let queue = self.queue_name(&bind.queue)?;
                context.check(Access::Write, "queue", queue.as_bytes())?;
                context.check(Access::Read, "exchange", bind.exchange.as_bytes())?;
                check_binding_topic(context, &bind.exchange, &bind.routing_key)?;
                self.require_queue(context, &queue)?;
                let binding = Binding { destination: Destination::Queue(queue), routing_key: bind.routing_key, arguments: bind.arguments };
                let ticket = context.broker.bind_unwaited(&context.vhost, &bind.exchange, binding)?;
                context.hold_until_durable(ticket);
                if !bind.nowait {
                    context.reply(id, QueueBindOk {}.into());
                }
            }
            Method::QueueUnbind(unbind) => {
                let queue = self.queue_name(&unbind.queue)?;
                context.check(Access::Write, "queue", queue.as_bytes())?;
                context.check(Access::Read, "exchange", unbind.exchange.as_bytes())?;
                check_binding_topic(context, &unbind.exchange, &unbind.routing_key)?;
                // Unbinding a queue that does not exist is a no-op that succeeds, as in RabbitMQ;
                // one that exists must still be this connection's if it is exclusive.
                if context.topology()?.read().queue(&queue).is_some() {
                    self.require_queue(context, &queue)?;
                }
                let binding =
                    Binding { destination: Destination::Queue(queue), routing_key: unbind.routing_key, arguments: unbind.arguments };
                let ticket = context.broker.unbind_unwaited(&context.vhost, &unbind.exchange, &binding)?;
                context.hold_until_durable(ticket);
                context.reply(id, QueueUnbindOk {}.into());
            }
            Method::QueuePurge(purge) => {
                let name = self.queue_name(&purge.queue)?;
                context.check(Access::Read, "queue", name.as_bytes())?;
                let queue = self.require_queue(context, &name)?;
                if let Some(stream) = queue.as_stream() {
                    return Err(AmqpError::not_implemented(format!(
                        "queue.purge not supported by stream queues queue '{}' in vhost '{}'",
                        stream.name(),
                        stream.vhost
                    )));
                }
                queue.check_local()?;
                let message_count = queue.purge();
                if !purge.nowait {
                    context.reply(id, QueuePurgeOk { message_count }.into());
                }
            }
            Method::QueueDelete(delete) => self.queue_delete(context, delete)?,
            other => return Err(refuse(&other)),
        }
        Ok(After::KeepOpen)
    }

    /// tx.*: select, commit, rollback.
    fn tx_method(&mut self, context: &mut Context, method: Method) -> Result<After, AmqpError> {
        let id = self.id();
        match method {
            Method::TxSelect(_) => {
                if self.confirm_sequence.is_some() {
                    return Err(AmqpError::precondition("cannot switch from confirm to tx mode"));
                }
                self.transaction.get_or_insert_with(Transaction::default);
                self.shared.transactional.store(true, Ordering::Relaxed);
                context.reply(id, TxSelectOk {}.into());
            }
            Method::TxCommit(_) => self.commit(context)?,
            Method::TxRollback(_) => {
                let Some(transaction) = self.transaction.as_mut() else {
                    return Err(AmqpError::precondition("channel is not transactional"));
                };
                *transaction = Transaction::default();
                context.reply(id, TxRollbackOk {}.into());
            }
            other => return Err(refuse(&other)),
        }
        Ok(After::KeepOpen)
    }

    /// confirm.select.
    fn confirm_method(&mut self, context: &mut Context, method: Method) -> Result<After, AmqpError> {
        let id = self.id();
        match method {
            Method::ConfirmSelect(select) => {
                if self.transaction.is_some() {
                    return Err(AmqpError::precondition("cannot switch from tx to confirm mode"));
                }
                self.confirm_sequence.get_or_insert(0);
                self.shared.confirm_mode.store(true, Ordering::Relaxed);
                if !select.nowait {
                    context.reply(id, ConfirmSelectOk {}.into());
                }
            }
            other => return Err(refuse(&other)),
        }
        Ok(After::KeepOpen)
    }

    /// queue.declare: a new queue is checked against what its type allows (see `queue_type`).
    fn queue_declare(&mut self, context: &mut Context, declare: QueueDeclare) -> Result<(), AmqpError> {
        if declare.queue.as_bytes() == crate::direct_reply::REPLY_TO_QUEUE.as_bytes() {
            // The direct reply-to pseudo-queue: RabbitMQ 3.10.8 answers any declare of it (passive
            // or not, consumed or not) with no messages and one consumer (measured).
            if !declare.nowait {
                let declare_ok = QueueDeclareOk { queue: declare.queue, message_count: 0, consumer_count: 1 };
                context.reply(self.id(), declare_ok.into());
            }
            return Ok(());
        }
        let server_named = declare.queue.is_empty() && !declare.passive;
        let name = if server_named { random_name("amq.gen-") } else { declare.queue.clone() };
        let name = if declare.passive && name.is_empty() { self.queue_name(&name)? } else { name };
        if !declare.passive {
            context.check(Access::Configure, "queue", name.as_bytes())?;
            check_dead_letter_permissions(context, &name, &declare.arguments)?;
        }
        let exclusive_owner = declare.exclusive.then_some(context.connection.id);
        let mut definition = QueueDefinition {
            name,
            durable: declare.durable,
            exclusive_owner,
            auto_delete: declare.auto_delete,
            arguments: declare.arguments,
            // Parsed from the arguments when the queue is created.
            queue_type: QueueType::default(),
        };
        if !declare.passive {
            definition = context.broker.with_default_queue_type(&context.vhost, definition);
        }
        let ((name, message_count, consumer_count), ticket) =
            context.broker.declare_queue_unwaited(&context.vhost, definition, declare.passive, server_named, context.connection.id)?;
        context.hold_until_durable(ticket);
        if declare.exclusive && !declare.passive && !context.exclusive_queues.contains(&name) {
            context.exclusive_queues.push(name.clone());
        }
        self.last_declared_queue = Some(name.clone());
        if !declare.nowait {
            context.reply(self.id(), QueueDeclareOk { queue: name, message_count, consumer_count }.into());
        }
        Ok(())
    }

    /// queue.delete, with if-unused and if-empty; deleting a queue that does not exist succeeds.
    fn queue_delete(&mut self, context: &mut Context, delete: QueueDelete) -> Result<(), AmqpError> {
        let name = self.queue_name(&delete.queue)?;
        context.check(Access::Configure, "queue", name.as_bytes())?;
        let exists = context.topology()?.read().queue(&name).is_some();
        let (message_count, consumers) = if exists {
            let queue = self.require_queue(context, &name)?;
            let (ready, consumers) = queue.counts();
            if delete.if_unused && consumers > 0 {
                return Err(AmqpError::precondition(format!("queue '{name}' in vhost '{}' in use", context.vhost)));
            }
            if delete.if_empty && ready > 0 {
                return Err(AmqpError::precondition(format!("queue '{name}' in vhost '{}' not empty", context.vhost)));
            }
            context.exclusive_queues.retain(|exclusive| exclusive != &name);
            context.broker.remove_queue_quietly(&context.vhost, &name, None)
        } else {
            (0, Vec::new())
        };
        if !delete.nowait {
            context.reply(self.id(), QueueDeleteOk { message_count }.into());
        }
        // After delete-ok, as RabbitMQ: its channel learns of its consumers' end from the
        // queue going away, which comes after the reply to the delete.
        crate::broker::notify_cancelled(&consumers);
        Ok(())
    }
}

/// RabbitMQ's check when a queue with a dead-letter exchange is created: its declarer must be
/// able to read the queue and write to the exchange, or dead-lettering would publish where the
/// declarer may not (`rabbit_channel`, queue.declare). A redeclaration of an existing queue is
/// not checked, as in RabbitMQ.
fn check_dead_letter_permissions(context: &Context, queue: &ShortStr, arguments: &FieldTable) -> Result<(), AmqpError> {
    let Some(FieldValue::LongStr(exchange)) = arguments.get("x-dead-letter-exchange") else {
        return Ok(());
    };
    if context.topology()?.read().queue(queue).is_some() {
        return Ok(());
    }
    context.check(Access::Read, "queue", queue.as_bytes())?;
    context.check(Access::Write, "exchange", exchange)
}

/// The read topic permission on a binding's key when its source is a topic exchange, checked
/// after the resource permissions and before the destination is looked up, as RabbitMQ 3.10.8's
/// `binding_action` does; a source that does not exist is left to the bind to refuse (404).
fn check_binding_topic(context: &Context, source: &ShortStr, key: &ShortStr) -> Result<(), AmqpError> {
    let topology = context.topology()?.read();
    match topology.exchange(source) {
        Some(exchange) => context.check_topic(exchange, crate::topic_permissions::TopicAccessKind::Read, key.as_bytes()),
        None => Ok(()),
    }
}
