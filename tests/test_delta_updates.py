"""DeltaUpdates (wbsp's update kind) on the reference numpy buffers: the arithmetic of upload and download,
in particular that a download keeps this rank's own upload that is still on its way into the global model."""
import numpy as np
import pytest

from hvd_elastic.engine.buffers import NumpyBuffers
from hvd_elastic.engine.updates import DeltaUpdates


class _Rank:
    """One rank's weights and its DeltaUpdates (no collective involved)."""

    def __init__(self, w0, size=2, inplace=False):
        self.w = np.array(w0, np.float64)
        # inplace: the frontend reads and changes its parameters in place (as torch's does), else the fallbacks
        # through read_params / write_params (as TensorFlow's)
        extra = dict(add_params_into=self._add_into, add_to_params=self._add_to) if inplace else {}
        self.updates = DeltaUpdates(NumpyBuffers(np.float64), len(w0), size, read_params=lambda: self.w.copy(),
                                    write_params=self._write, **extra)

    def _add_into(self, dst, alpha):
        dst += alpha * self.w

    def _add_to(self, src, alpha):
        self.w += alpha * src

    def _write(self, w):
        self.w[:] = w

    def upload(self):
        """The push of one step: returns the delta it sends (what a tick would sum)."""
        sent = np.zeros_like(self.w)
        self.updates.push_function()(sent, 1.0)
        self.updates.pushed()
        return sent


@pytest.mark.parametrize("inplace", [False, True])
def test_download_keeps_the_own_upload_not_yet_in_the_global_model(inplace):
    r = _Rank([1.0, 2.0, 3.0], inplace=inplace)
    r.w += [0.1, 0.0, 0.0]                 # local step 1
    d1 = r.upload()
    np.testing.assert_allclose(d1, [0.1, 0.0, 0.0])
    r.updates.proceeding()                 # step 1 ends without a download: the next delta starts from here
    other = np.array([0.0, 0.4, 0.0])      # another rank's delta, in the same tick as d1
    r.updates.apply(d1 + other, 2)         # W += sum / n
    r.w += [0.0, 0.0, 0.2]                 # local step 2, uploaded; its tick has not come back
    d2 = r.upload()
    np.testing.assert_allclose(d2, [0.0, 0.0, 0.2])
    r.updates.download(keep_latest=True)
    w_model = np.array([1.05, 2.2, 3.0])
    np.testing.assert_allclose(r.updates.global_model, w_model)   # a download leaves W as it is
    np.testing.assert_allclose(r.w, w_model + d2)        # not W alone: step 2 is kept
    # the next upload is the delta since the download only: d2 is not sent twice
    r.w += [0.0, 0.05, 0.0]
    np.testing.assert_allclose(r.upload(), [0.0, 0.05, 0.0])
    # once W holds every upload, a plain download is exactly W
    r.updates.apply(d2 + np.array([0.0, 0.05, 0.0]), 2)
    r.updates.download()
    np.testing.assert_allclose(r.w, w_model + (d2 + [0.0, 0.05, 0.0]) / 2)


@pytest.mark.parametrize("inplace", [False, True])
def test_plain_download_replaces_the_weights_and_resets_the_delta(inplace):
    r = _Rank([0.0, 0.0], inplace=inplace)
    r.w += [1.0, -1.0]
    r.upload()
    r.updates.download(keep_latest=False)  # the upload is not in W yet, and the rank drops it from its weights
    np.testing.assert_allclose(r.w, [0.0, 0.0])
    r.w += [0.5, 0.0]
    np.testing.assert_allclose(r.upload(), [0.5, 0.0])   # measured from the downloaded model


def test_consecutive_uploads_without_downloads_each_send_their_own_step():
    r = _Rank([0.0, 0.0, 0.0], inplace=True)
    sent = []
    for k in range(3):
        r.w[k] += 1.0 + k                  # local step k
        sent.append(r.upload())
        r.updates.proceeding()
    np.testing.assert_allclose(sum(sent), r.w)                 # nothing sent twice, nothing lost
    np.testing.assert_allclose(sent[2], [0.0, 0.0, 3.0])
    with pytest.raises(RuntimeError, match="without an upload"):
        r.updates.download(keep_latest=True)                   # no upload since base moved: nothing to keep
