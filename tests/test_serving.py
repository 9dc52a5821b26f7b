"""The pieces vLLM's and llama.cpp's servers share (`specdec_lab.serving`): the metrics page read under each
server's prefix, and a server that dies while starting reported with its log, not waited for."""

import sys

import pytest

from specdec_lab.serving import OpenAIServer, free_port, parse_spec_metrics

# The counters as llama-server's /metrics writes them (tools/server/server-task.cpp), with a vLLM line beside
# them that must not be counted under llama.cpp's prefix.
LLAMACPP_PAGE = """# HELP llamacpp:spec_decode_num_draft_tokens_total Speculative: Total draft tokens generated
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 40
llamacpp:spec_decode_num_accepted_tokens_total 23
llamacpp:spec_decode_num_drafts_total 10
llamacpp:n_decode_total 99
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 9
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 7
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="3"} 2
vllm:spec_decode_num_drafts_total{engine="0"} 1000.0
"""


def test_each_server_is_read_under_its_own_prefix():
    counts = parse_spec_metrics(LLAMACPP_PAGE, "llamacpp:")
    assert counts == {"drafts": 10, "draft_tokens": 40, "accepted": 23, "accepted_per_position": [9, 7, 0, 2]}
    assert parse_spec_metrics(LLAMACPP_PAGE, "vllm:")["drafts"] == 1000


class ExitingServer(OpenAIServer):
    name = "test server"

    def request_extras(self) -> dict:
        return {}

    def emitted_tokens(self, reply) -> list[int]:
        return []


def test_a_server_that_dies_while_starting_is_reported_with_its_log():
    port = free_port()
    command = [sys.executable, "-c", "import sys; print('cannot load the model'); sys.exit(3)"]
    with pytest.raises(RuntimeError, match=r"test server stopped \(exit 3\)(.|\n)*cannot load the model"):
        ExitingServer(command, {}, port, timeout=60)
