#!/usr/bin/python3
"""GStreamer's playbin, unmodified, with fake sinks that keep real-time sync, for
`cargo xtask bench players`.

gst-launch-1.0 cannot say where playback is, so this runs the same playbin from Python and
prints one line per video frame as the video sink renders it:

    frame MONOTONIC_NS PTS_NS

MONOTONIC_NS is CLOCK_MONOTONIC when the sink rendered the frame (after its clock wait, since
the sink syncs), PTS_NS the frame's presentation time. Before each seek it prints
`seek MONOTONIC_NS`. Errors go to stderr and end the program with exit code 1.
"""

import argparse
import random
import sys
import time

import gi

gi.require_version("Gst", "1.0")
from gi.repository import GLib, Gst  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--start", type=float, default=0.0, help="start position (s)")
    parser.add_argument("--seek-every", type=float, default=0.0,
                        help="seek to a random position this often (s); 0: never")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    Gst.init(None)
    playbin = Gst.ElementFactory.make("playbin", None)
    if playbin is None:
        sys.exit("gst_player: GStreamer has no playbin (gstreamer1.0-plugins-base missing)")
    video = Gst.ElementFactory.make("fakesink", "video")
    audio = Gst.ElementFactory.make("fakesink", "audio")
    for sink in (video, audio):
        sink.set_property("sync", True)
    video.set_property("signal-handoffs", True)
    playbin.set_property("video-sink", video)
    playbin.set_property("audio-sink", audio)
    playbin.set_property("uri", Gst.filename_to_uri(args.path))

    def on_frame(_sink, buffer, _pad):
        print(f"frame {time.monotonic_ns()} {buffer.pts}", flush=True)

    video.connect("handoff", on_frame)
    loop = GLib.MainLoop()
    failure = []

    def on_message(_bus, message):
        if message.type == Gst.MessageType.ERROR:
            error, debug = message.parse_error()
            failure.append(f"gst_player: {error.message} ({debug})")
            loop.quit()
        elif message.type == Gst.MessageType.EOS:
            loop.quit()

    bus = playbin.get_bus()
    bus.add_signal_watch()
    bus.connect("message", on_message)

    flags = Gst.SeekFlags.FLUSH | Gst.SeekFlags.KEY_UNIT
    if args.start > 0:
        # As a player resumes: preroll, seek while paused, then play.
        playbin.set_state(Gst.State.PAUSED)
        playbin.get_state(Gst.CLOCK_TIME_NONE)
        playbin.seek_simple(Gst.Format.TIME, flags, int(args.start * Gst.SECOND))
        playbin.get_state(Gst.CLOCK_TIME_NONE)
    playbin.set_state(Gst.State.PLAYING)

    if args.seek_every > 0:
        rng = random.Random(args.seed)

        def seek():
            ok, duration = playbin.query_duration(Gst.Format.TIME)
            if ok and duration > 0:
                target = int(rng.uniform(0, 0.9) * duration)
                print(f"seek {time.monotonic_ns()}", flush=True)
                playbin.seek_simple(Gst.Format.TIME, flags, target)
            return True

        GLib.timeout_add(int(args.seek_every * 1000), seek)

    GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, 15, loop.quit)
    GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, 2, loop.quit)
    loop.run()
    playbin.set_state(Gst.State.NULL)
    if failure:
        sys.exit(failure[0])


if __name__ == "__main__":
    main()
