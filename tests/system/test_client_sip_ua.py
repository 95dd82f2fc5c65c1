"""brisvox/client/sip.py against a scripted SIP server on loopback (brisvox.wire's parser and
response builder play the server): the client UA's transaction behaviour.

* INVITE retransmission on T1 until a response; a failure response is ACKed
  in its transaction (same branch, the response's To tag) and becomes a
  TransportError naming the status;
* a 2xx is ACKed in a new transaction (CSeq 1 ACK) and every retransmitted
  2xx is ACKed again; the answer's codec and RTP address are used (audio in
  is decoded and reported);
* the server's BYE is answered 200 and ends the call once; the client then
  sends no BYE of its own;
* a server that never answers fails after ``response_timeout``.
"""

from __future__ import annotations

import asyncio
import socket

import numpy as np
import pytest

from brisvox.client.sip import SipTransport
from brisvox.client.transport import BotEvents, TransportError
from brisvox.wire import rtp, sdp
from brisvox.wire.g711 import PCMU
from brisvox.wire.sip_dialog import Dialog, make_response
from brisvox.wire.sip_message import SipMessage, new_tag, parse
from brisvox.wire.sip_transaction import Timers

pytestmark = pytest.mark.system

FAST = Timers(t1=0.05, t2=0.2, t4=0.2)


class Server(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.got: list[SipMessage] = []
        self.queue: asyncio.Queue[tuple[SipMessage, tuple[str, int]]] = asyncio.Queue()
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        m = parse(data)
        self.got.append(m)
        self.queue.put_nowait((m, addr))

    async def next(self, method: str | None = None, timeout: float = 2.0) -> tuple[SipMessage, tuple[str, int]]:
        async with asyncio.timeout(timeout):
            while True:
                m, addr = await self.queue.get()
                if method is None or m.method == method or (not m.is_request and method == "response"):
                    return m, addr

    def send(self, msg: SipMessage, addr: tuple[str, int]) -> None:
        assert self.transport is not None
        self.transport.sendto(msg.serialize(), addr)


async def start_server() -> tuple[Server, int]:
    loop = asyncio.get_running_loop()
    _, srv = await loop.create_datagram_endpoint(Server, local_addr=("127.0.0.1", 0), family=socket.AF_INET)
    assert srv.transport is not None
    return srv, srv.transport.get_extra_info("sockname")[1]


def test_invite_is_retransmitted_and_a_failure_is_acked_and_reported():
    async def main() -> None:
        srv, port = await start_server()
        t = SipTransport(f"sip:busy@127.0.0.1:{port}", timers=FAST)
        opener = asyncio.create_task(t.open(BotEvents()))
        inv1, addr = await srv.next("INVITE")
        inv2, _ = await srv.next("INVITE")  # no answer to the first: Timer A retransmits it
        assert inv2.serialize() == inv1.serialize()
        assert inv1.uri == f"sip:busy@127.0.0.1:{port}" and inv1.body.startswith(b"v=0")
        offer = sdp.parse(inv1.body)
        assert offer.media[0].formats == ["0", "8", "101"]
        srv.send(make_response(inv1, 100), addr)
        srv.send(make_response(inv1, 486, to_tag="busytag"), addr)
        with pytest.raises(TransportError, match="486"):
            await opener
        ack, _ = await srv.next("ACK")
        assert ack.top_via.branch == inv1.top_via.branch and ack.to_tag == "busytag"
        assert ack.cseq == (1, "ACK")
        srv.transport.close()

    asyncio.run(main())


def test_answered_call_acks_every_2xx_plays_rtp_and_ends_on_the_servers_bye():
    async def main() -> None:
        srv, port = await start_server()
        rtp_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        rtp_sock.bind(("127.0.0.1", 0))
        rtp_sock.settimeout(2.0)
        rtp_port = rtp_sock.getsockname()[1]
        audio: list[np.ndarray] = []
        ends: list[str] = []
        t = SipTransport(f"sip:local@127.0.0.1:{port}", timers=FAST)
        opener = asyncio.create_task(t.open(BotEvents(on_audio=lambda pcm, now: audio.append(pcm),
                                                      on_end=lambda why, now: ends.append(why))))
        inv, addr = await srv.next("INVITE")
        offer = sdp.parse(inv.body)
        neg = sdp.negotiate(offer)
        answer = sdp.build(host="127.0.0.1", port=rtp_port, session_id=1, version=1, neg=neg, offer=offer)
        tag = new_tag()
        ok = make_response(inv, 200, to_tag=tag, contact=f"<sip:srv@127.0.0.1:{port}>", body=answer,
                           content_type="application/sdp")
        srv.send(ok, addr)
        await asyncio.wait_for(opener, 2)
        ack1, _ = await srv.next("ACK")
        assert ack1.cseq == (1, "ACK") and ack1.to_tag == tag and ack1.top_via.branch != inv.top_via.branch
        srv.send(ok, addr)  # a retransmitted 200: ACKed again
        ack2, _ = await srv.next("ACK")
        assert ack2.cseq == (1, "ACK")
        # RTP both ways
        await t.send_audio(np.full(160, 1000, np.int16))
        pkt = rtp.parse(rtp_sock.recv(2048))
        assert pkt.payload_type == 0 and pkt.marker and len(pkt.payload) == 160
        cport = t.rtp.transport.get_extra_info("sockname")[1]
        rtp_sock.sendto(rtp.build(0, True, 1, 160, 7, PCMU.encode(np.full(160, 2000, np.int16)).tobytes()),
                        ("127.0.0.1", cport))
        for _ in range(50):
            if audio:
                break
            await asyncio.sleep(0.01)
        assert audio and abs(int(audio[0][0]) - 2000) < 100
        # the server hangs up
        dlg = Dialog.from_invite(inv, tag, f"<sip:srv@127.0.0.1:{port}>", addr)
        bye = dlg.request("BYE", f"127.0.0.1:{port}")
        srv.send(bye, addr)
        resp, _ = await srv.next("response")
        assert resp.status == 200 and resp.cseq[1] == "BYE"
        assert ends == ["the server hung up (BYE)"]
        await t.close()
        await asyncio.sleep(0.1)
        assert not [m for m in srv.got if m.method == "BYE"]  # no BYE of ours after theirs
        assert ends == ["the server hung up (BYE)"]
        rtp_sock.close()
        srv.transport.close()

    asyncio.run(main())


def test_a_silent_server_fails_after_the_response_timeout():
    async def main() -> None:
        srv, port = await start_server()
        t = SipTransport(f"sip:x@127.0.0.1:{port}", timers=FAST, response_timeout=0.3)
        with pytest.raises(TransportError, match="nothing within"):
            await asyncio.wait_for(t.open(BotEvents()), 3)
        assert len([m for m in srv.got if m.method == "INVITE"]) >= 2
        srv.transport.close()

    asyncio.run(main())
