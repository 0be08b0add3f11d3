from xetfs.commands.cli import main

raise SystemExit(main())
