"""A node cut off from the cluster and from etcd, for real: it runs in a network
namespace this test makes (support/netns.py), and the cut is its link going
down. The others see it down and serve on; it keeps what it has and refuses
catalogue changes; healed, it rejoins and catches up."""

from __future__ import annotations

import json
import sys
import textwrap

import pika
import pytest

from ..support.cluster import Cluster, wait_for
from ..support.netns import Namespace

pytestmark = [pytest.mark.run_once, pytest.mark.slow]

# A client inside the namespace, for the node there while it is cut off.
INSIDE = textwrap.dedent("""
    import json, sys, pika
    url, queue = sys.argv[1], sys.argv[2]
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    answer = {"messages": channel.queue_declare(queue, passive=True).method.message_count}
    try:
        channel.queue_declare("made-while-cut-off", durable=True)
        answer["declare"] = "ok"
    except pika.exceptions.AMQPError as error:
        answer["declare"] = repr(error)
    print(json.dumps(answer))
""")


def test_a_node_cut_off_is_down_for_the_others_serves_what_it_has_and_catches_up(tmp_path):
    with Namespace() as namespace, Cluster(tmp_path, namespace=namespace) as cluster:
        one, _, cut = cluster.nodes
        with pika.BlockingConnection(pika.URLParameters(cut.url)) as there:
            channel = there.channel()
            channel.queue_declare("on-cut", durable=True,
                                  arguments={"x-queue-leader-locator": "client-local"})
            channel.confirm_delivery()
            for i in range(3):
                channel.basic_publish("", "on-cut", b"%d" % i,
                                      pika.BasicProperties(delivery_mode=2))
        with pika.BlockingConnection(pika.URLParameters(one.url)) as here:
            here.channel().queue_declare("on-one", durable=True,
                                         arguments={"x-queue-leader-locator": "client-local"})

        namespace.cut()
        wait_for(lambda: "n3" not in one.running_nodes(), 15, "n1 sees n3 down")
        with pika.BlockingConnection(pika.URLParameters(one.url)) as here:
            channel = here.channel()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
                channel.queue_declare("on-cut", passive=True)
            assert refused.value.reply_code == 404
            assert "home node 'n3' of durable queue 'on-cut'" in refused.value.reply_text
            channel = here.channel()  # the rest of the cluster serves, and changes
            channel.confirm_delivery()
            channel.basic_publish("", "on-one", b"still", pika.BasicProperties(delivery_mode=2))
            channel.queue_declare("made-while-apart", durable=True)

        # Inside, the cut-off node still serves its queue, and refuses a change
        # of the catalogue once it has seen etcd go (within the lease's time).
        def inside() -> dict:
            done = namespace.run(sys.executable, "-c", INSIDE, cut.url, "on-cut")
            assert done.returncode == 0, done.stderr
            return json.loads(done.stdout)

        answer = wait_for(lambda: (a := inside())["declare"] != "ok" and a, 20,
                          "n3 refuses catalogue changes while cut off")
        assert answer["messages"] == 3
        assert "541" in answer["declare"] and "metadata store" in answer["declare"]

        namespace.heal()
        wait_for(lambda: "n3" in one.running_nodes(), 30, "n1 sees n3 again")
        wait_for(lambda: any(q["name"] == "made-while-apart" for q in cut.api("queues")), 15,
                 "n3 has the change made while it was cut off")
        with pika.BlockingConnection(pika.URLParameters(one.url)) as here:
            got = wait_for(lambda: here.channel().basic_get("on-cut", auto_ack=True)[2], 15,
                           "n3's queue served through n1 again")
            assert got == b"0"
    for node in cluster.nodes:
        assert "Traceback" not in node.log_text(), node.log_text()
