"""Worked examples from shared/spec/vectors.md that several test modules use verbatim."""

# vectors.md "Claim transition ticket": the reference's exact serialisation.
CLAIM_TICKET_JSON = """{
  "schema": "steadq-transition-ticket",
  "version": 2,
  "queue_id": "000102030405060708090a0b0c0d0e0f",
  "operation": "claim",
  "phase": "linearized",
  "source_identity": {
    "job_id": "f0e1d2c3b4a5968778695a4b3c2d1e0f",
    "generation": 0,
    "attempt": 0,
    "maximum_attempts": 3,
    "lease_token": "00112233445566778899aabbccddeeff",
    "envelope_digest": "3824863bf5184c54b02246d36bef0f2513d421261636643097038039cfe497b7",
    "payload_length": 11
  },
  "source": {
    "state": "ready"
  },
  "destination_derivation": {
    "state": "leased",
    "boot_id": "12345678-1234-1234-1234-123456789abc",
    "boottime_deadline_ns": 1030000000000,
    "wall_deadline_ns": 1700000035000000000
  }
}"""
