"""Pause an Environment (a checkpoint; its CPU and memory are released) and resume it with every file kept.

Run against `adx up`: `python examples/pause_and_resume.py`.
"""

import adx

with adx.Client() as client:
    env = client.environments.create(
        cpu="500m",
        memory="256Mi",
        idle_timeout=600,  # paused after 10 idle minutes instead of deleted
        idle_action=adx.IdleAction.PAUSE,
    )
    try:
        env.files.write("/work/progress.txt", "step 1 done\n")
        env.commands.run("mkdir -p /tmp/cache && echo warm > /tmp/cache/state")

        env.pause()
        print("state after pause:", client.environments.get(env.id).state)

        env.resume()  # any command or file call would wake it too
        print(env.files.read("/work/progress.txt").decode(), end="")
        print(env.commands.run("cat /tmp/cache/state").stdout, end="")
    finally:
        env.delete()
