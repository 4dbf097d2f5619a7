from launchers.cli import main

main()
