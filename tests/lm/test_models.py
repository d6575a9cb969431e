import pytest

from epr.lm.models import PACKAGED, check_license, resolve_lm


def test_gemma_is_opt_in(monkeypatch, tmp_path):
    monkeypatch.delenv("EPR_ACCEPT_GEMMA_TERMS", raising=False)
    with pytest.raises(PermissionError, match=r"Gemma Terms of Use.*EPR_ACCEPT_GEMMA_TERMS=1"):
        resolve_lm("gemma3-270m", str(tmp_path))
    monkeypatch.setenv("EPR_ACCEPT_GEMMA_TERMS", "yes")  # only an explicit 1 accepts
    with pytest.raises(PermissionError):
        check_license("gemma3-270m")
    monkeypatch.setenv("EPR_ACCEPT_GEMMA_TERMS", "1")
    check_license("gemma3-270m")
    check_license("smollm2")  # Apache-2.0: no consent needed
    assert [n for n, s in PACKAGED.items() if "license" in s] == ["gemma3-270m"]
