//! basic.get, including the one that finds its queue's ready messages still on disk: RabbitMQ
//! answers such a get with the oldest message, so it waits for the page-in. The wait is on the
//! connection's task (no frame of the connection is handled meanwhile, so replies stay in order),
//! never on a thread.

use super::{Channel, Context};
use crate::metrics::counters::bump_single_writer;
use crate::queue_type::{GetAnswer, Queue, GET_PAGE_IN_ROUNDS_MAX};
use amqp_codec::{BasicGetEmpty, ShortStr};

/// A basic.get waiting for its queue's page-in: the connection waits with
/// [`Queue::wait_for_page_in`], then calls [`Channel::answer_get`] again.
pub struct WaitingGet {
    /// The channel the get came on.
    pub channel: u16,
    /// The queue it reads.
    pub queue: Queue,
    /// basic.get's no-ack.
    pub no_ack: bool,
    /// Page-ins waited for so far.
    pub rounds: u32,
}

impl Channel {
    /// Answers a basic.get from `queue`: get-ok, get-empty, or a wait for the page-in (left in
    /// `context.waiting_get` for the connection).
    pub(super) fn answer_get(&mut self, context: &mut Context, queue: Queue, no_ack: bool, rounds: u32) {
        match queue.get(&self.shared, no_ack) {
            GetAnswer::Message(get_ok) => context.connection.send(get_ok),
            GetAnswer::PageInPending if rounds < GET_PAGE_IN_ROUNDS_MAX => {
                context.waiting_get = Some(WaitingGet { channel: self.id(), queue, no_ack, rounds: rounds + 1 });
            }
            GetAnswer::PageInPending => {
                tracing::warn!(queue = %queue.name(), rounds, "basic.get gave up waiting for a page-in; answering get-empty");
                self.answer_get_empty(context);
            }
            GetAnswer::Empty => self.answer_get_empty(context),
        }
    }

    fn answer_get_empty(&self, context: &Context) {
        bump_single_writer(&self.shared.publish_counters.get_empty);
        context.reply(self.id(), BasicGetEmpty { cluster_id: ShortStr::from("") }.into());
    }

    /// Answers a get that waited for a page-in (see [`WaitingGet`]).
    pub fn resume_get(&mut self, context: &mut Context, waiting: WaitingGet) {
        self.answer_get(context, waiting.queue, waiting.no_ack, waiting.rounds);
    }
}
